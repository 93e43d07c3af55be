"""Entry points: the mtplab command, doctor and the GPU check."""
