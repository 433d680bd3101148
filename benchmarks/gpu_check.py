"""The device check of issue 31: temper's figures on one engine, in one call, as one JSON.

    python -m benchmarks.gpu_check --provider cuda --out DIR [--work DIR] [--wheels DIR] [--quick]
    python -m benchmarks.gpu_check --provider cpu --quick --out DIR       # the dry run CI runs

Per model (the digits CNN; torchvision's resnet18 with random weights, skipped where torchvision does not
import): `temper run` on a generated recipe with FP32 / FP16 / static INT8 and `providers: [cpu, PROVIDER]`
(fidelity, samples/s and speedup intervals at batch 1, 32, 256, the selected pair and why); the PyTorch
ceiling on the same device (FP32 and BF16 autocast) and the selected pair's ratio to it; `temper serve` of
the selected model at 1, 32 and 64 clients over HTTP and gRPC against the pair's own batched figure, and
its /metrics memory lines; memory of the server over requests of varying row counts; CUDA graphs off and on
for the selected model at batch 1, 32 and 256 (gpu_check_graphs.py). benchmarks/README.md
says how a session with a lent GPU runs it.

Only stdlib at the top: with --wheels, temper's dependencies are installed (pip --target, from carried
wheels) before anything imports them, and the check runs again in a child that sees them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipeline", "calibration", "validators", "artifacts")  # temper.<name> = ROOT/<name> (pyproject)
# pip's console script for temper's entry point (pyproject [project.scripts])
CONSOLE = "#!{python}\nimport sys\nfrom temper.pipeline.cli import main\nsys.exit(main())\n"


def install(wheels: Path, site: Path) -> dict[str, str]:
    """pip install --no-index --no-deps --target SITE every wheel in WHEELS; temper itself from this tree (a
    `temper` folder of links, as the editable install maps it) with its console script in SITE/bin. Returns
    the environment that sees them first."""
    found = sorted(str(w) for w in wheels.glob("*.whl"))
    if not found:
        raise SystemExit(f"error: no *.whl in {wheels}")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--no-cache-dir", "--upgrade", "--target", str(site), *found], check=True, stdout=sys.stderr)
    (site / "temper").mkdir(parents=True, exist_ok=True)
    for name in PACKAGES:
        link = site / "temper" / name
        if not link.exists():
            link.symlink_to(ROOT / name, target_is_directory=True)
    script = site / "bin" / "temper"
    if not script.is_file():
        script.parent.mkdir(parents=True, exist_ok=True)
        script.write_text(CONSOLE.format(python=sys.executable))
        script.chmod(0o755)
    path = os.pathsep.join(p for p in (str(site), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, "PATH": f"{site / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}


def cuda_libraries() -> list[str]:
    """The lib folders of the NVIDIA pip packages beside torch (cuDNN, cuBLAS, ... for CUDA 13), for the
    children's LD_LIBRARY_PATH: onnxruntime-gpu looks for them on the loader's path, and a `temper serve`
    worker that never imports torch would otherwise not find them and fall back to the CPU."""
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    return sorted(str(lib) for root in roots for lib in Path(root).glob("*/lib") if lib.is_dir())


def settings(quick: bool) -> dict[str, Any]:
    """Seconds and counts per measurement: --quick is the CI dry run's, sized for a 2-core machine."""
    if quick:
        return {"temper_duration_s": 0.2, "torch_seconds": 0.3, "torch_warmup_s": 0.2, "serve_seconds": 1.0,
                "clients": [1, 32, 64], "soak_requests": 200, "soak_clients": 4}
    return {"temper_duration_s": 1.0, "torch_seconds": 2.0, "torch_warmup_s": 1.0, "serve_seconds": 5.0,
            "clients": [1, 32, 64], "soak_requests": 2000, "soak_clients": 8}


def host() -> dict[str, Any]:
    """temper's host profile, the GPU as nvidia-smi names it, and the libraries this check ran with."""
    import importlib.metadata

    import onnxruntime
    import torch

    import temper.pipeline
    from temper.artifacts.core.host import profile

    found: dict[str, Any] = {"profile": profile().model_dump(), "python": sys.version.split()[0],
                             "temper_from": str(Path(temper.pipeline.__file__).resolve().parent.parent)}
    try:
        found["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True).stdout.strip().splitlines()
    except (OSError, subprocess.SubprocessError) as exc:
        found["nvidia_smi"] = f"absent: {type(exc).__name__}"
    found["torch"] = {"version": torch.__version__, "cuda": torch.version.cuda,
                      "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                      "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    found["onnxruntime_import"] = {"version": onnxruntime.__version__, "file": onnxruntime.__file__,
                                   "providers": onnxruntime.get_available_providers()}
    versions: dict[str, str | None] = {}
    for dist in ("onnxruntime", "onnxruntime-gpu", "onnx", "numpy", "torchvision", "tritonclient", "grpcio",
                 "pydantic", "psutil"):
        try:
            versions[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[dist] = None
    found["distributions"] = versions
    return found


def check_model(name: str, args: argparse.Namespace, conf: dict[str, Any], env: dict[str, str]) -> dict[str, Any]:
    """One model: temper run, the PyTorch ceiling and its ratios, temper serve and the memory soak."""
    from benchmarks import gpu_check_run, gpu_check_torch

    if name == "resnet18" and (why := gpu_check_torch.torchvision_error()) is not None:
        return {"skipped": why}
    make = gpu_check_run.digits_recipe if name == "digits" else gpu_check_run.resnet18_recipe
    result: dict[str, Any] = {"temper": gpu_check_run.run(make(args.provider, conf["temper_duration_s"]),
                                                          args.out, args.work, env)}
    if "error" in result["temper"]:
        return result
    device = "cuda" if args.provider in ("cuda", "tensorrt") else "cpu"
    session = result["temper"]["selected_session"] or {}
    threads = session.get("intra_op_threads") if device == "cpu" else None
    result["torch_ceiling"] = gpu_check_torch.ceiling(name, device, gpu_check_run.BATCHES, conf["torch_seconds"],
                                                      conf["torch_warmup_s"], threads)
    result["ratio_to_torch"] = ratios(result["temper"]["selected_batches"], result["torch_ceiling"]["figures"])
    result["serve"] = serve(name, result["temper"], args, conf, device == "cuda")
    result["cuda_graphs"] = graphs(result["serve"]["bundle"], args.provider, conf)
    return result


def graphs(bundle: dict[str, Any], provider: str, conf: dict[str, Any]) -> dict[str, Any]:
    """CUDA graphs off and on for the model the run selected, on the row it was gated on."""
    from benchmarks import gpu_check_graphs

    return gpu_check_graphs.compare(Path(bundle["model_folder"]) / "model.onnx", bundle["engine"] or provider,
                                    bundle["session"], conf["temper_duration_s"], conf["torch_warmup_s"])


def ratios(selected: dict[str, dict[str, Any]], figures: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The selected pair's samples/s over PyTorch's FP32 and BF16-autocast samples/s, batch by batch."""
    found = {}
    for batch, measured in selected.items():
        ours, fp32, bf16 = (measured["samples_per_s"], figures["fp32"][batch]["samples_per_s"],
                            figures["bf16-autocast"][batch]["samples_per_s"])
        found[batch] = {"temper_samples_per_s": ours, "torch_fp32": fp32, "torch_bf16": bf16,
                        "ratio_fp32": ours / fp32, "ratio_bf16": ours / bf16, "ratio_best": ours / max(fp32, bf16)}
    return found


def serve(name: str, summary: dict[str, Any], args: argparse.Namespace, conf: dict[str, Any],
          gpu: bool) -> dict[str, Any]:
    """temper serve of the run's selected model: load points against the pair's best batched figure from
    `summary` (the temper run's), /metrics memory lines, the memory soak."""
    from benchmarks import gpu_check_serve as s

    folder, config = s.bundle(Path(summary["output"]), args.work / f"bundle-{name}")
    row = (1, 8, 8) if name == "digits" else (3, 224, 224)
    model = s.model_of(folder, config["name"], row)
    engine_figures = summary["selected_batches"]
    best_batch = max(engine_figures, key=lambda b: engine_figures[b]["samples_per_s"])
    reference = {"pair": summary["selected"]["pair"], "batch": int(best_batch),
                 "samples_per_s": engine_figures[best_batch]["samples_per_s"]}
    server = s.serve(folder, args.work)
    try:
        points = s.load_points(server, model, conf["clients"], conf["serve_seconds"], args.work)
        for point in points:
            point["ratio_to_engine"] = point["req_per_s"] / reference["samples_per_s"]
        memory = s.memory_lines(server.port)
        max_rows = s.MAX_BATCH if name == "digits" else 16
        soak = s.soak(server, model, conf["soak_requests"], max_rows, conf["soak_clients"], gpu)
    finally:
        server.stop()
    return {"bundle": config, "engine_reference": reference, "points": points, "metrics_memory_lines": memory,
            "soak": soak, "server_log": str(server.logfile)}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--provider", required=True, choices=["cpu", "cuda", "tensorrt"],
                        help="the engine under test, paired with ONNX Runtime CPU (the reference)")
    parser.add_argument("--out", type=Path, required=True, help="where gpu_check.json and the recipes go")
    parser.add_argument("--work", type=Path, help="models, bundles, cache and logs (default: OUT/work)")
    parser.add_argument("--quick", action="store_true", help="short windows and 200 soak requests (the CI run)")
    parser.add_argument("--models", default="digits,resnet18", help="comma-separated: digits, resnet18")
    parser.add_argument("--wheels", type=Path, help="pip install these wheels (--no-index --no-deps) into --site "
                                                    "first, and run the check with them first on the path")
    parser.add_argument("--site", type=Path, default=Path("/tmp/temper-site"), help="where --wheels installs")
    parser.add_argument("--duration", type=float, help="override validate.throughput.duration_s (temper's timing)")
    parser.add_argument("--soak-requests", type=int, help="override the requests of varying shapes (2000; 200 quick)")
    args = parser.parse_args(argv)
    if args.wheels is not None:
        env = install(args.wheels.resolve(), args.site.resolve())
        rest = [a for i, a in enumerate(argv) if a != "--wheels" and (i == 0 or argv[i - 1] != "--wheels")]
        return subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", *rest], env=env, cwd=ROOT).returncode
    from benchmarks.recipes import private_base

    args.out = args.out.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    args.work, env = private_base((args.work or args.out / "work"), "temper-gpu-check-")
    conf = settings(args.quick)
    if args.duration is not None:
        conf["temper_duration_s"] = args.duration
    if args.soak_requests is not None:
        conf["soak_requests"] = args.soak_requests
    if args.provider != "cpu":
        libraries = cuda_libraries()
        conf["ld_library_path_added"] = libraries
        env["LD_LIBRARY_PATH"] = os.environ["LD_LIBRARY_PATH"] = os.pathsep.join(
            [*libraries, *filter(None, [os.environ.get("LD_LIBRARY_PATH")])])
    began = time.monotonic()
    result: dict[str, Any] = {"provider": args.provider, "quick": args.quick, "settings": conf,
                              "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "host": host(), "models": {}}
    code = 0
    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        result["models"][name] = {}
        _write(args.out, result)
        try:
            result["models"][name] = check_model(name, args, conf, env)
        except (Exception, SystemExit) as exc:
            result["models"][name]["error"] = f"{type(exc).__name__}: {exc}"
            result["models"][name]["traceback"] = traceback.format_exc()[-4000:]
            code = 1
        if "error" in result["models"][name].get("temper", {}):
            code = 1
        _write(args.out, result)
    result["wall_s"] = time.monotonic() - began
    _write(args.out, result)
    print(f"wrote {args.out / 'gpu_check.json'} in {result['wall_s']:.0f} s", file=sys.stderr)
    return code


def _write(out: Path, result: dict[str, Any]) -> None:
    """After every step, so a run cut short by the device's time limit still leaves what it measured."""
    (out / "gpu_check.json").write_text(json.dumps(result, indent=2, default=str) + "\n")


if __name__ == "__main__":
    sys.exit(main())
