"""A coefficient file read again in one process: not built again, handed out as an independent
copy; a changed file, or the same text under another path, is read anew."""

import shutil

import pytest

from roofcal.errors import RoofcalError
from roofcal.model import coeffs as C
from roofcal.resources import COEFFS

A100 = COEFFS / "a100_sxm.yaml"


def test_a_file_read_again_is_an_independent_copy_of_what_was_built(tmp_path, monkeypatch):
    built = []
    real = C._from_text
    monkeypatch.setattr(C, "_from_text", lambda text, src: built.append(src) or real(text, src))
    monkeypatch.setattr(C, "_LOADED", {})
    path = tmp_path / "a100.yaml"
    shutil.copy(A100, path)
    first = C.load(path, "a100_sxm")
    first.notes.append("a caller's change")                  # stays the caller's own
    first.kernel_sets[first.kernels].ops["gemm/bf16"]["latency"] = 0.0
    second = C.load(path)
    assert built == [str(path)]                              # built once
    assert "a caller's change" not in second.notes and second.source == str(path)
    assert C.to_yaml(second) == C.to_yaml(real(path.read_text(), str(path)))   # as built afresh
    other = tmp_path / "copy.yaml"                           # same text, another path: its own source
    shutil.copy(A100, other)
    assert C.load(other).source == str(other) and built == [str(path), str(other)]
    path.write_text(path.read_text().replace("calibrated: true", "calibrated: false", 1))
    assert C.load(path).calibrated is False and len(built) == 3      # changed text: read anew
    with pytest.raises(RoofcalError, match="fitted for GPU 'a100_sxm', not 'h100_sxm'"):
        C.load(path, "h100_sxm")                             # the GPU check still applies to a copy
