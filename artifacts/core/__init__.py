"""What every layer of temper shares: errors, ONNX file helpers, batch layouts, the user-code boundary,
the recipe's base model, which folders temper may delete, and the facts of this host (its ONNX Runtime,
its GPU stack, the distributions installed). Imports nothing else of temper."""
