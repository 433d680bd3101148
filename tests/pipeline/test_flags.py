"""The numbers and models users hand the commands, through the console script: every numeric flag finite
and in range, models bench cannot fill, a preset of the wrong shape. Each refusal is exit 2 and one stderr
line naming the flag or key, never a traceback, a silent default or a command that never ends."""

from __future__ import annotations

import json
import subprocess
import typing
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from temper.artifacts.formats.bundle import config_for, write
from temper.pipeline.cli import app
from tests.pipeline.test_cli_contract import TEMPER, one_line, tiny_model, tiny_recipe

# (command, arguments before the flag, flag, bad value): every numeric flag, each edge it must refuse
BAD_NUMBERS = [
    ("bench", ["MODEL"], "--duration", "inf"),  # never ended
    ("bench", ["MODEL"], "--duration", "nan"),  # blamed the model
    ("bench", ["MODEL"], "--duration", "1e300"),  # finite, and still never ends
    ("bench", ["MODEL"], "--duration", "0"),
    ("bench", ["MODEL"], "--warmup", "nan"),  # never ended
    ("bench", ["MODEL"], "--warmup", "inf"),
    ("serve", ["BUNDLE"], "--max-body-mb", "nan"),  # a traceback from int()
    ("serve", ["BUNDLE"], "--max-body-mb", "inf"),
    ("serve", ["BUNDLE"], "--max-body-mb", "1e-9"),  # 0 bytes: silently the default
    ("serve", ["BUNDLE"], "--max-body-mb", "4096"),  # past gRPC's 2 GiB message limit: a traceback with --grpc-port
    ("serve", ["BUNDLE"], "--port", "70000"),  # bound port 70000 - 65536 = 4464
    ("serve", ["BUNDLE"], "--port", "-1"),  # exit 3, as if the host were at fault
    ("serve", ["BUNDLE"], "--grpc-port", "0"),
    ("serve", ["BUNDLE"], "--max-connections", "0"),
    ("serve", ["BUNDLE"], "--instances", "-1"),
    ("serve", ["BUNDLE"], "--instances", "65"),  # past the 64 worker processes serve starts at most
    ("serve", ["BUNDLE"], "--burst-fallback-ms", "nan"),  # a latency target: a positive number of ms
    ("capacity", ["BUNDLE"], "--p99-ms", "0"),  # no request answers in 0 ms: a search that never passes
    ("capacity", ["BUNDLE", "--p99-ms", "50"], "--rounds", "0"),  # no interval
    ("capacity", ["BUNDLE", "--p99-ms", "50"], "--seconds", "inf"),  # never ends
    ("capacity", ["BUNDLE", "--p99-ms", "50"], "--steps", "11"),
    ("capacity", ["BUNDLE", "--p99-ms", "50"], "--start-rate", "nan"),
    ("capacity", ["BUNDLE", "--p99-ms", "50"], "--max-rate", "0.5"),
    ("export-triton", ["BUNDLE", "--dest", "REPO"], "--instances", str(2**31)),  # past Triton's int32 count
    ("export-triton", ["BUNDLE", "--dest", "REPO"], "--instances", "0"),
    ("export-triton", ["BUNDLE", "--dest", "REPO"], "--version", "0"),  # Triton ignores a version folder 0
    ("export-ensemble", ["pipe=a,b", "--dest", "REPO"], "--version", "0"),
    ("sensitivity", ["RECIPE", "--candidate", "fp16"], "--top", "0"),
    ("sensitivity", ["RECIPE", "--candidate", "fp16"], "--samples", "0"),
]


def _temper(*args: object, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """The console script; a short timeout, since the old failure was a command that never ends."""
    return subprocess.run([str(TEMPER), *map(str, args)], capture_output=True, text=True, timeout=timeout)


def _refused(result: subprocess.CompletedProcess[str], start: str, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr
    line = one_line(result)
    assert line.startswith(start) and all(f in line for f in fragments), line
    return line


@pytest.fixture
def places(tmp_path: Path) -> dict[str, Path]:
    """Real things for every command to point at: an ONNX model, a serving bundle, a recipe."""
    model = tiny_model(tmp_path / "model" / "model.onnx")
    return {"MODEL": model, "BUNDLE": write(tmp_path / "bundle", model, config_for(model, "tiny")),
            "RECIPE": tiny_recipe(tmp_path / "recipe"), "REPO": tmp_path / "repo"}


def _numeric_options() -> dict[tuple[str, str], typing.Any]:
    """(command, flag) -> its typer OptionInfo, for every option of the app typed int or float (optional or not)."""
    found = {}
    for command in app.registered_commands:
        assert command.callback is not None
        name = command.name or command.callback.__name__
        for hint in typing.get_type_hints(command.callback, include_extras=True).values():
            if typing.get_origin(hint) is not typing.Annotated:
                continue
            base, info = typing.get_args(hint)[:2]
            if {base, *typing.get_args(base)} & {int, float} and isinstance(getattr(info, "default", None), str):
                found[(name, info.default)] = info
    return found


def test_every_numeric_flag_is_checked_by_the_one_validator_and_covered_here() -> None:
    """A new numeric flag must be made by cli.common.number and get its refusal cases above."""
    options = _numeric_options()
    assert set(options) == {(command, flag) for command, _, flag, _ in BAD_NUMBERS}
    assert {flag: info.callback.__qualname__ for (_, flag), info in options.items()} == {
        flag: "number.<locals>.check" for _, flag in options}


@pytest.mark.parametrize(("command", "before", "flag", "value"), BAD_NUMBERS,
                         ids=[f"{c}{f}={v}" for c, _, f, v in BAD_NUMBERS])
def test_a_numeric_flag_out_of_range_is_one_line_and_exit_2(places: dict[str, Path], command: str,
                                                            before: list[str], flag: str, value: str) -> None:
    result = _temper(command, *(places.get(a, a) for a in before), flag, value)
    _refused(result, f"error: Invalid value for '{flag}': must be ", "got ", f"(see temper {command} --help)")
    assert not places["REPO"].exists()


def test_a_dim_size_of_digits_int_cannot_read_is_refused(places: dict[str, Path]) -> None:
    _refused(_temper("bench", places["MODEL"], "--dim", "seq=²"), f"error: {places['MODEL']}: --dim: ", "'seq=²'")


# --- models bench cannot fill with random data


def _save(path: Path, x: onnx.ValueInfoProto, y: onnx.ValueInfoProto, node: onnx.NodeProto) -> Path:
    graph = helper.make_graph([node], path.stem, [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_bench_on_a_model_whose_inputs_are_all_scalars(tmp_path: Path) -> None:
    """No batch dim: only batch size 1 means anything, and it is measured."""
    model = _save(tmp_path / "scalar.onnx", helper.make_tensor_value_info("x", TensorProto.FLOAT, []),
                  helper.make_tensor_value_info("y", TensorProto.FLOAT, []), helper.make_node("Relu", ["x"], ["y"]))
    _refused(_temper("bench", model, "--duration", "0.1"), f"error: {model}: --batch-sizes: ",
             "every input of the model is a scalar", "batch size 8 cannot run")
    measured = _temper("bench", model, "--batch-sizes", "1", "--duration", "0.1", "--warmup", "0", "--json")
    assert measured.returncode == 0, measured.stderr
    assert json.loads(measured.stdout)[0]["batch_size"] == 1


def test_bench_on_a_model_with_a_sequence_input(tmp_path: Path) -> None:
    model = _save(tmp_path / "seq.onnx", helper.make_tensor_sequence_value_info("s", TensorProto.FLOAT, ["b", 4]),
                  helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4]),
                  helper.make_node("ConcatFromSequence", ["s"], ["y"], axis=0))
    _refused(_temper("bench", model, "--duration", "0.1"), f"error: {model}: MODEL: ",
             "input 's' is a sequence, not a tensor")


# --- a recipe's preset of the wrong shape


@pytest.mark.parametrize(("preset", "key"), [({"name": "avx2"}, "preset"), ([["avx2"]], "preset[0]")],
                         ids=["mapping", "nested-list"])
def test_a_preset_that_is_not_a_name_is_bad_input(tmp_path: Path, preset: object, key: str) -> None:
    """A list is a search over presets (one candidate each), so a nested list reaches the schema as a list."""
    recipe = tiny_recipe(tmp_path, candidates={"q": {"steps": [{"quantize": {"mode": "dynamic", "preset": preset}}]}})
    _refused(_temper("check", recipe), f"error: {recipe}: candidates.q.steps[0].quantize.{key}: ",
             "is not one of auto, ")
