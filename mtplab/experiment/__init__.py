"""One experiment point: RunConfig (every run parameter, validated once), run_point on mtplab's engine or the onnxruntime-genai peer, and the cost model's calibration."""
