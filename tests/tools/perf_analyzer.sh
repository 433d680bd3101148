#!/usr/bin/env bash
# Install Triton's perf_analyzer for the tests, once, into its own folder (never temper's venv):
#   tests/tools/perf_analyzer.sh [DEST]     (DEST defaults to .cache/perf_analyzer under the repo root)
# It prints DEST/run, a wrapper that sets LD_LIBRARY_PATH and runs the binary.
#
# Why these pieces: `pip install perf-analyzer` is a placeholder; a working binary ships inside the
# tritonclient 2.47.0 wheel (the 2.60 wheels need glibc 2.38, Debian 12 has 2.36). It links
# libb64 (Debian's libb64-0d) and libcudart.so.12 (PyPI's nvidia-cuda-runtime-cu12; no GPU needed).
# Needs pip (python3 -m pip), apt-get and dpkg-deb; any failed download fails the script, exit 3.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
dest="${1:-$root/.cache/perf_analyzer}"
PYTHON="${PYTHON:-python3}"
if [ -x "$dest/run" ] && "$dest/run" --version >/dev/null 2>&1; then
  echo "$dest/run"; exit 0
fi
fail() { echo "perf_analyzer set-up: $1" >&2; exit 3; }
rm -rf "$dest.partial" && mkdir -p "$dest.partial/downloads" "$dest.partial/lib"
cd "$dest.partial/downloads"
"$PYTHON" -m pip download --quiet --no-deps tritonclient==2.47.0 -d . \
  || fail "cannot download tritonclient==2.47.0 (pip download); check the package index is reachable"
"$PYTHON" -m pip download --quiet --no-deps "nvidia-cuda-runtime-cu12==12.9.79" -d . \
  || fail "cannot download nvidia-cuda-runtime-cu12 (pip download); check the package index is reachable"
apt-get download libb64-0d >/dev/null 2>&1 \
  || fail "cannot download Debian's libb64-0d (apt-get download); run apt-get update first"
"$PYTHON" - <<'PY' || fail "the downloaded wheels do not hold perf_analyzer or libcudart.so.12"
import glob, os, shutil, zipfile
for wheel, member, target in [
    (glob.glob("tritonclient-2.47.0-*.whl")[0], "tritonclient-2.47.0.data/data/bin/perf_analyzer", "../perf_analyzer"),
    (glob.glob("nvidia_cuda_runtime_cu12-*.whl")[0], "nvidia/cuda_runtime/lib/libcudart.so.12", "../lib/libcudart.so.12"),
]:
    with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(target, "wb") as out:
        shutil.copyfileobj(src, out)
os.chmod("../perf_analyzer", 0o755)
PY
dpkg-deb -x libb64-0d_*.deb b64 || fail "cannot unpack libb64-0d (dpkg-deb)"
cp -P b64/usr/lib/x86_64-linux-gnu/libb64.so* ../lib/
cd .. && rm -rf downloads
cat > run <<'SH'
#!/usr/bin/env bash
here="$(cd "$(dirname "$0")" && pwd)"
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/perf_analyzer" "$@"
SH
chmod +x run
./run --version >/dev/null 2>&1 || ./run --help >/dev/null 2>&1 || fail "perf_analyzer does not start: $(./run --version 2>&1 | head -1)"
cd "$root" && rm -rf "$dest" && mv "$dest.partial" "$dest"
echo "$dest/run"
