"""A kernel built in this process is lowered from the module it was printed from
(`kernel_ir.take_built`, `compiler._lower`), not parsed again: the same LLVM IR as
lowering its parsed text, and each module is taken once."""

from __future__ import annotations

from scanweaver import compiler
from scanweaver.runtime import kernel_ir
from scanweaver.runtime.cpu_selective_exp import scalef_exp
from scanweaver.workloads.specs import SelectiveScanSpec


def test_the_built_module_lowers_to_the_parsed_texts_llvm_ir(tmp_path, monkeypatch):
    monkeypatch.setenv("SCANWEAVER_CACHE_DIR", str(tmp_path))  # (built here, not read from the disk cache)
    spec = SelectiveScanSpec(4, "shared", "const", True, False, True, True, False, True)
    ir = kernel_ir.kernel_ir("selective_tiled", spec=spec, scalef=scalef_exp())
    built = kernel_ir._JUST_BUILT.get(ir.text)
    assert built is not None
    lowered = [compiler.lower(ir.text, "cpu", keep_stages=False, verify=False, cleanup=False, skip_idle=True)
               for _ in range(2)]
    assert lowered[0].module is built and lowered[1].module is not built  # taken once, then parsed
    assert kernel_ir.take_built(ir.text) is None
    first, second = (compiler.cpu_llvm_ir(x.module, cleanup=True)[0] for x in lowered)
    assert first == second and "define" in first
