#!/usr/bin/env bash
# Make .whl/: verl 0.9.1 and what it needs beyond the lent GPU machine's own packages (Python 3.12,
# torch 2.11, no network), as wheels for that machine, under its 64 MiB upload limit. Run here, then
# carry .whl to that machine for benchmarks/gpu_checks.sh.
#
# The list is this project's .venv minus the packages that machine has (device KINDS.md), minus
# video decoders, OpenRLHF/DeepSpeed and developer tools. ray's wheel (79 MB) is repacked without
# its Java jar and the libraries verl does not import (rllib, serve, llm, tune, train, data, the
# dashboard's web client), which brings it to 40 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
platforms=(manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_24_x86_64 manylinux_2_27_x86_64
           manylinux_2_28_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux_2_35_x86_64)
packages=(aiohttp-cors==0.8.1 annotated-types==0.8.0 cachetools==8.0.2 cffi==2.1.1 codetiming==1.4.0
  colorful==0.5.8 cryptography==50.0.2 datasets==5.2.0 dill==0.4.1 distlib==0.4.4 distro==1.9.0
  fastapi==0.165.0 google-api-core==2.44.0 google-auth==2.63.0 googleapis-common-protos==1.76.0
  hjson==3.1.0 hydra-core==1.3.8 importlib_metadata==10.2.0 jsonschema==4.26.0
  jsonschema-specifications==2025.9.1 latex2sympy2_extended==1.11.0 lazy-importer==0.1.0
  math-verify==0.9.0 mathruler==0.1.0 msgspec==0.23.0 multiprocess==0.70.19 nvtx==0.2.17
  omegaconf==2.3.1 opencensus==0.11.4 opencensus-context==0.1.3 opentelemetry-api==1.45.2
  opentelemetry-exporter-http-transport==0.66b2 opentelemetry-exporter-otlp-common==0.66b2
  opentelemetry-exporter-otlp-proto-common==1.45.2 opentelemetry-exporter-otlp-proto-http==1.45.2
  opentelemetry-exporter-prometheus==0.66b2 opentelemetry-proto==1.45.2 opentelemetry-sdk==1.45.2
  opentelemetry-semantic-conventions==0.66b2 orjson==3.13.0 platformdirs==4.14.9 proto-plus==1.29.0
  pyasn1==0.6.5 pyasn1_modules==0.4.2 pycparser==3.12 pydantic==2.14.4 pydantic_core==2.50.5
  pylatexenc==2.11 pytest-asyncio==1.5.0 pytest-rerunfailures==16.7 python-discovery==1.9.9
  pyvers==0.1.0 pyzmq==27.3.0 qwen-vl-utils==0.0.14 ray==2.60.0 referencing==0.37.0
  rpds-py==2026.9.1 smart_open==9.0.4 sniffio==1.3.1 starlette==1.10.0 tensordict==0.10.0
  torchdata==0.11.0 TransferQueue==0.1.11 typing-inspection==0.4.5 tzdata==2026.6 uvicorn==0.55.0
  verl==0.9.1)
for package in "${packages[@]}"; do
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]/#/--platform=}" -d .whl "$package"
done
python3 -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3  # an sdist only: built here
python3 - <<'PY'
import zipfile
from pathlib import Path

(wheel,) = Path(".whl").glob("ray-*.whl")
unused = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/serve/", "ray/llm/", "ray/tune/", "ray/train/", "ray/data/")
trimmed = wheel.with_suffix(".tmp")
with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(trimmed, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as target:
    for entry in source.infolist():
        if entry.filename.startswith(unused):
            continue
        data = source.read(entry)
        if entry.filename.endswith(".dist-info/RECORD"):
            data = "".join(line + "\n" for line in data.decode().splitlines() if not line.startswith(unused)).encode()
        target.writestr(entry, data)
trimmed.replace(wheel)
PY
du -sh .whl
