"""A coefficient file read again in one process: not built again, handed out as an independent
copy; a changed file, or the same text under another path, is read anew. Its serving stacks
read alone (what a fit carries): the same as the whole file's."""

import re
import shutil

import pytest

from roofcal import io
from roofcal.errors import RoofcalError
from roofcal.model import coeffs as C
from roofcal.resources import COEFFS

A100 = COEFFS / "a100_sxm.yaml"


def test_a_file_read_again_is_an_independent_copy_of_what_was_built(tmp_path, monkeypatch):
    built = []
    real = C._from_text
    monkeypatch.setattr(C, "_from_text", lambda text, src: built.append(src) or real(text, src))
    monkeypatch.setattr(io, "_PARSED", {})
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


def _same_stacks(got, c):
    return got.gpu == c.gpu and got.stack == c.stack and list(got.stacks) == list(c.stacks) and \
        all(C.stack_to_dict(got.stacks[k]) == C.stack_to_dict(c.stacks[k]) for k in c.stacks)


def test_top_level_entries_of_a_block_mapping():
    from roofcal.io import top_level_entries
    text = ("# a comment\nschema: x/1\nnotes:\n- one\n-\n  two: 2\nkernel_sets:\n  a:\n    b: [1, 2]\n"
            "stacks:\n  s: {k: 1}\n\nstack: s\n")
    assert top_level_entries(text, ("schema", "stacks", "stack")) == "schema: x/1\nstacks:\n  s: {k: 1}\n\nstack: s\n"
    assert top_level_entries(text, ("notes",)) == "notes:\n- one\n-\n  two: 2\n"
    assert top_level_entries("{schema: x, stacks: {}}\n", ("stacks",)) is None       # flow style
    assert top_level_entries("---\nschema: x\n", ("schema",)) is None                  # a marker
    assert top_level_entries("'schema': x\n", ("schema",)) is None                     # a quoted key


@pytest.mark.slow
def test_stacks_read_alone_are_the_files_stacks(tmp_path):
    import yaml
    for path in (COEFFS / "h100_sxm.yaml", A100):
        assert _same_stacks(C.read_stacks(path), C.load(path))
    flow = tmp_path / "flow.yaml"                                # another layout: read whole
    doc = yaml.safe_load(A100.read_text())
    flow.write_text(yaml.safe_dump(doc, default_flow_style=True, width=10**9, sort_keys=False))
    assert _same_stacks(C.read_stacks(flow), C.load(A100))
    broken = tmp_path / "broken.yaml"                            # the stacks are checked as load checks them
    broken.write_text(A100.read_text().replace("\nstacks:\n", "\nstacks: 5\nold_stacks:\n", 1))
    with pytest.raises(RoofcalError, match=r"broken.yaml: field 'stacks' must map stack names to stacks"):
        C.read_stacks(broken)
    bad = tmp_path / "bad.yaml"                                  # bad YAML: the whole file's line
    bad.write_text(A100.read_text().replace("\nstacks:\n", "\nstacks:\n  [\n", 1))
    with pytest.raises(RoofcalError) as whole:
        C.load(bad)
    assert re.search(r"bad.yaml: invalid YAML at line \d{4}", str(whole.value))   # past the kernels
    with pytest.raises(RoofcalError) as alone:
        C.read_stacks(bad)
    assert str(alone.value) == str(whole.value)


def test_rows_of_a_kernel_set_the_file_lacks_take_the_nearest_older_one():
    from roofcal.model.coeffs import nearest_kernel_set
    sets = ["vllm-0.14.0", "vllm-0.24.0"]
    assert nearest_kernel_set(sets, "vllm-0.24.0", "vllm-0.14.0") == "vllm-0.24.0"
    assert nearest_kernel_set(sets, "vllm-0.25.1", "vllm-0.14.0") == "vllm-0.24.0"   # newer rows
    assert nearest_kernel_set(sets, "vllm-0.20.0", "vllm-0.14.0") == "vllm-0.14.0"   # between
    assert nearest_kernel_set(sets, "vllm-0.10.0", "vllm-0.24.0") == "vllm-0.14.0"   # older: the oldest
    assert nearest_kernel_set(sets, "sglang-0.5.0", "vllm-0.14.0") == "vllm-0.14.0"  # another framework
