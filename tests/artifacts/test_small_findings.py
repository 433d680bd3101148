"""Issue 36's smaller findings, against a real server and through the console script: JSON data of the wrong
kind for its datatype (`true`, `"0.5"` as FP32; `1.5` or 300 as integers) is `400` naming the input, as Triton
refuses it, instead of being cast; `HEAD` on a GET route answers as GET does without the body (it was `405`);
an empty folder flag (`--dest ""`, `--output ""`, `--manifests ""`) is one line naming the flag, exit 2,
instead of writing into the working folder."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from temper.artifacts.serving.runtime import Runtime
from tests.artifacts.servers import MODEL, Client, Served, _inputs
from tests.pipeline.test_cli_contract import one_line, temper, tiny_recipe


@pytest.fixture(scope="module")
def port(tiny: Path) -> Iterator[int]:
    with Served(Runtime(tiny)) as served:
        yield served.port


def _request(x: object = None, ids: object = None) -> dict:
    good = _inputs(3, rows=1)
    return {"inputs": [
        {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": good["x"].ravel().tolist() if x is None else x},
        {"name": "ids", "shape": [1, 3], "datatype": "INT64",
         "data": good["ids"].ravel().tolist() if ids is None else ids}]}


@pytest.mark.parametrize(("x", "ids", "said"), [
    ([True, False, True, True], None, "input 'x': data is not FP32: JSON true/false given"),
    (["0.5", "1", "2", "3"], None, "input 'x': data is not FP32: JSON strings given"),
    (None, [1.5, 2, 3], "input 'ids': data is not INT64: JSON fractional numbers given"),
    (None, [1, 2, 2**64], "input 'ids': data is not INT64"),
], ids=["bools", "strings", "fraction-for-int64", "past-int64"])
def test_json_data_of_another_kind_is_refused(port: int, x: object, ids: object, said: str) -> None:
    client = Client(port)
    status, _, body = client.infer(_request(x, ids))
    assert status == 400, body
    assert said in json.loads(body)["error"], body
    status, _, body = client.infer(_request())  # the server answers on
    assert status == 200, body
    client.close()


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready", f"/v2/models/{MODEL}", "/v2", "/metrics"])
def test_head_answers_as_get_without_the_body(port: int, path: str) -> None:
    client = Client(port)
    get_status, get_headers, get_body = client.call("GET", path)
    status, headers, body = client.call("HEAD", path)
    assert (status, body) == (get_status, b"") and status == 200
    assert get_headers["content-length"] == str(len(get_body))
    if path == "/metrics":  # its counters and process gauges move between two scrapes: its own length, announced
        assert int(headers["content-length"]) > 0
    else:
        assert headers["content-length"] == get_headers["content-length"]
    assert client.call("HEAD", f"/v2/models/{MODEL}/infer")[0] == 405  # a POST route
    client.close()


@pytest.mark.parametrize("command", [["pull", "models:/tiny@candidate", "--dest", ""],
                                     ["export-triton", "BUNDLE", "--dest", ""],
                                     ["export-triton", "BUNDLE", "--dest", "repo", "--manifests", ""],
                                     ["run", "recipe.yaml", "--output", ""],
                                     ["check", "recipe.yaml", "--cache-dir", ""]])
def test_an_empty_folder_flag_is_refused_not_the_working_folder(tmp_path: Path, tiny: Path, command: list[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    tiny_recipe(work)
    before = sorted(p.name for p in work.iterdir())
    result = temper(*[str(tiny) if part == "BUNDLE" else part for part in command], cwd=work)
    assert result.returncode == 2, result.stderr
    flag = command[command.index("") - 1]
    assert one_line(result).startswith(f"error: Invalid value for '{flag}'") and "is empty" in one_line(result)
    assert sorted(p.name for p in work.iterdir()) == before  # nothing written into the working folder
