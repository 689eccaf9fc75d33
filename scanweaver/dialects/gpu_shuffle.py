"""`gpu.shuffle`, which xDSL 0.74's gpu dialect lacks, in upstream MLIR's form.

    %r, %valid = gpu.shuffle up %value, %offset, %width : f32

(generic form: `"gpu.shuffle"(%v, %o, %w) <{mode = #gpu<shuffle_mode up>}> :
(f32, i32, i32) -> (f32, i1)`), so upstream `mlir-opt` lowers it to `nvvm.shfl.sync`
(64-bit values as two 32-bit shuffles). Lanes of a warp exchange `value`; the source
lane of lane `l` in its segment of `width` lanes is `l - offset` (up), `l + offset`
(down), `l ^ offset` (xor) or `offset` (idx). `valid` is false where that lane lies
outside the segment; the result there is unspecified (the thread-block simulator
returns garbage), so a kernel selects on `valid`. Every lane of the segment must
execute the same shuffle (warp-uniform control flow).

`GPU_WITH_SHUFFLE` is xDSL's gpu dialect plus this op and its mode attribute: the
dialect `scanweaver.ir.make_context` loads for "gpu".
"""

from __future__ import annotations

from enum import auto

from xdsl.dialects import gpu
from xdsl.dialects.builtin import Float32Type, Float64Type, IntegerType, i1, i32
from xdsl.dialects.utils import EnumAttribute
from xdsl.ir import Attribute, Dialect, SpacedOpaqueSyntaxAttribute, SSAValue
from xdsl.irdl import (
    IRDLOperation,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException
from xdsl.utils.str_enum import StrEnum


class ShuffleModeEnum(StrEnum):
    XOR = auto()
    UP = auto()
    DOWN = auto()
    IDX = auto()


@irdl_attr_definition
class ShuffleModeAttr(EnumAttribute[ShuffleModeEnum], SpacedOpaqueSyntaxAttribute):
    name = "gpu.shuffle_mode"


@irdl_op_definition
class ShuffleOp(IRDLOperation):
    name = "gpu.shuffle"

    value = operand_def()
    offset = operand_def(i32)
    width = operand_def(i32)
    mode = prop_def(ShuffleModeAttr)
    shuffle_result = result_def()
    valid = result_def(i1)

    traits = traits_def(Pure())

    def __init__(self, mode: ShuffleModeEnum | str, value: SSAValue, offset: SSAValue, width: SSAValue):
        super().__init__(
            operands=[value, offset, width],
            result_types=[value.type, i1],
            properties={"mode": ShuffleModeAttr(ShuffleModeEnum(mode))},
        )

    def verify_(self) -> None:
        t: Attribute = self.value.type
        if self.shuffle_result.type != t:
            raise VerifyException(f"gpu.shuffle: result type {self.shuffle_result.type} is not the value's {t}")
        ok = isinstance(t, (Float32Type, Float64Type)) or (isinstance(t, IntegerType) and t.width.data in (32, 64))
        if not ok:
            raise VerifyException(f"gpu.shuffle: {t} is not a 32- or 64-bit integer or float (f32, f64, i32, i64)")


GPU_WITH_SHUFFLE = Dialect(
    "gpu",
    [*gpu.GPU.operations, ShuffleOp],
    [*gpu.GPU.attributes, ShuffleModeAttr],
)
