"""A decoder LLM as an MLflow pyfunc model: the model builder folder (model, external data, genai_config.json with
its generation config under `search`, tokenizer.json and tokenizer_config.json) as the one artifact, and greedy
generation through artifacts/engines/decoder_session.py's loop, the one the gates ran and `temper serve` runs, as
predict. Like log_bundle's models it ships temper's artifacts/ as code, so loading it needs no temper install."""

from __future__ import annotations

import tempfile
from pathlib import Path

import mlflow
import pandas as pd
from mlflow.models import ModelSignature
from mlflow.models.model import ModelInfo
from mlflow.pyfunc.model import PythonModel, PythonModelContext
from mlflow.types import ColSpec, Schema

from temper.artifacts.core import distributions
from temper.artifacts.core.errors import RequestError
from temper.artifacts.registry.pyfunc import _stage_code

ARTIFACT = "decoder"
DEFAULT_MAX_TOKENS = 16
SIGNATURE = ModelSignature(inputs=Schema([ColSpec("string", "text_input"), ColSpec("long", "max_tokens",
                                                                                    required=False)]),
                           outputs=Schema([ColSpec("string", "text_output")]))


class DecoderPyfunc(PythonModel):
    """predict: a DataFrame with text_input (and max_tokens, 16 when absent) -> one with text_output, greedy."""

    def load_context(self, context: PythonModelContext) -> None:
        from tokenizers import Tokenizer

        from temper.artifacts.engines.decoder_session import DecoderSession

        folder = Path(context.artifacts[ARTIFACT])
        self.session = DecoderSession(folder)
        self.tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))

    def predict(self, context: PythonModelContext, model_input: pd.DataFrame,
                params: dict | None = None) -> pd.DataFrame:
        texts = []
        limits = model_input["max_tokens"] if "max_tokens" in model_input else [DEFAULT_MAX_TOKENS] * len(model_input)
        for text, limit in zip(model_input["text_input"], limits, strict=True):
            prompt = self.tokenizer.encode(str(text), add_special_tokens=False).ids
            limit = DEFAULT_MAX_TOKENS if pd.isna(limit) else int(limit)
            if not prompt or limit < 1 or len(prompt) + limit > self.session.layout.context_length:
                raise RequestError(f"text_input {text!r} with max_tokens {limit}: empty, or over the context of "
                                   f"{self.session.layout.context_length} tokens")
            tokens = list(self.session.greedy(prompt, limit))
            texts.append(self.tokenizer.decode(tokens, skip_special_tokens=True))
        return pd.DataFrame({"text_output": texts})


def log_decoder(folder: Path, name: str = "model") -> ModelInfo:
    """Log the builder folder as a pyfunc model in the active MLflow run."""
    requirements = [distributions.pin(p) for p in (*distributions.of_role("served"), "tokenizers")]
    with tempfile.TemporaryDirectory() as staging:
        code = _stage_code(Path(staging))
        return mlflow.pyfunc.log_model(name=name, python_model=DecoderPyfunc(), artifacts={ARTIFACT: str(folder)},
                                       code_paths=[str(code)], signature=SIGNATURE, pip_requirements=requirements,
                                       input_example=pd.DataFrame({"text_input": ["Hello"], "max_tokens": [2]}))
