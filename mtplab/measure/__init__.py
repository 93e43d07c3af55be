"""Numbers: paired rounds and their statistics, the one RunResult, the speculative-decoding theory, the environment a number was taken in."""
