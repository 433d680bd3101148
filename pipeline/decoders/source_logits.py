"""The source framework's own view of the recipe's text: transformers runs the recipe's model (the HF folder, or
the GGUF file as transformers reads it) on the same token sequences, so the FP32 ONNX baseline can be gated
against it (an export alone can move a model's perplexity). Per sequence: the mean next-token NLL and each
position's argmax token.

Run as `python -m temper.pipeline.decoders.source_logits SOURCE SEQUENCES.json OUT.json` (SOURCE a folder or a
.gguf file), a process of its own so torch and the weights leave with it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def source_view(source: Path, sequences: list[list[int]]) -> dict[str, list]:
    import torch
    from transformers import AutoModelForCausalLM

    if source.suffix == ".gguf":
        model = AutoModelForCausalLM.from_pretrained(str(source.parent), gguf_file=source.name, dtype="float32")
    else:
        model = AutoModelForCausalLM.from_pretrained(str(source), dtype="float32")
    model.eval()
    nll: list[float] = []
    argmax: list[list[int]] = []
    with torch.inference_mode():
        for ids in sequences:
            logits = model(torch.tensor([ids])).logits[0].float()
            logp = torch.log_softmax(logits[:-1], dim=-1)
            targets = torch.tensor(ids[1:])
            nll.append(float(-logp[torch.arange(len(targets)), targets].mean()))
            argmax.append(logits[:-1].argmax(-1).tolist())
    return {"nll": nll, "argmax": argmax}


if __name__ == "__main__":
    given = json.loads(Path(sys.argv[2]).read_text())
    Path(sys.argv[3]).write_text(json.dumps(source_view(Path(sys.argv[1]), given)))
