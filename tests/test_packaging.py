"""The wheel carries conf/ and the built-in model, and `rlft train` runs from it outside the checkout."""

import os
import subprocess
import sys
import zipfile

import pytest

from conftest import ROOT, TINY_RUN


@pytest.mark.slow
def test_rlft_trains_from_the_installed_wheel_layout(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path / "dist"), str(ROOT)],
                   check=True, capture_output=True)
    wheel = next((tmp_path / "dist").glob("rlft-*.whl"))
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(site)
    assert "rlft/conf/config.yaml" in names and "rlft/conf/algo/grpo.yaml" in names
    assert "rlft/conf/experiment/smollm2_chain_sum.yaml" in names  # the presets travel too
    assert "rlft/models/tiny_adder/model.safetensors" in names
    # Run with only the extracted wheel on the path, from a folder that is not the checkout.
    env = os.environ | {"PYTHONPATH": str(site), "TQDM_DISABLE": "1"}
    work = tmp_path / "elsewhere"
    work.mkdir()
    code = "import rlft.cli, sys; print(rlft.cli.config_dir()); sys.exit(rlft.cli.main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, "train", f"hydra.run.dir={work / 'run'}", *TINY_RUN,
                           "trainer.steps=1"], cwd=work, env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == str(site / "rlft" / "conf")
    assert (work / "run" / "final_model" / "model.safetensors").exists()
