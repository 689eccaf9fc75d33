"""What a call of a GPU function refuses, through each driver binding (fakes): the
checks run before any launch, raise the error class a numpy user expects, and the
arguments that are accepted reach the driver as exact 64-bit descriptors."""

from __future__ import annotations

import struct

import numpy as np
import pytest

from scanweaver.errors import ScanWeaverTypeError, ScanWeaverValueError
from scanweaver.runtime import cuda_driver
from scanweaver.runtime.cuda import CudaFunction, CudaModule
from scanweaver.runtime.cuda_driver import CudaPythonDriver, NumbaCudaDriver, NumbaDriver
from scanweaver.runtime.cuda_launch import KernelLaunch
from tests.cuda_fakes import fake_cuda_bindings_driver, fake_launch_kernel, fake_numba_cuda
from tests.test_cuda_drivers import DESC, SIZES, expected_bytes


@pytest.fixture(autouse=True)
def _fresh_drivers():
    cuda_driver.reset_drivers()
    yield
    cuda_driver.reset_drivers()


def _binding(name: str, sizes=SIZES):
    """(driver, list the fake appends each launch to) for one binding."""
    if name == "numba":
        launches: list = []
        return NumbaDriver(fake_numba_cuda("Built-in"), fake_launch_kernel(sizes, launches)), launches
    drv = fake_cuda_bindings_driver(sizes)
    if name == "numba-cuda":
        return NumbaCudaDriver(fake_numba_cuda("NVIDIA"), drv), drv.launches
    return CudaPythonDriver(drv), drv.launches


BINDINGS = ["cuda-python", "numba-cuda", "numba"]


def _function(driver, launches=(DESC,), arg_count=3):
    return CudaFunction(CudaModule("// ptx\n", driver=driver), "f", list(launches), arg_count)


class _Dev:
    """A device array seen only through `__cuda_array_interface__` (never dereferenced
    by these tests: the fake launches read the parameters, not the data)."""

    def __init__(self, shape, ptr, typestr="<f4", strides=None):
        self.__cuda_array_interface__ = {
            "shape": shape, "typestr": typestr, "data": (ptr, False), "strides": strides, "version": 3,
        }


@pytest.mark.parametrize("binding", BINDINGS)
def test_non_native_byte_order_is_refused(binding):
    """A big-endian float32 array has the right kind and size: before this check it ran
    and the kernel read its bytes as other numbers (inf, 1e32, ...) without a word."""
    driver, launches = _binding(binding)
    fn = _function(driver)
    a, h = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(ScanWeaverTypeError, match=r"argument #0 has float32 elements in non-native byte order \('>f4'\)"):
        fn(a.astype(">f4"), 0.5, h)
    with pytest.raises(ScanWeaverTypeError, match="argument #2 has float32 elements in non-native byte order"):
        fn(a, 0.5, h.astype(">f4"))
    with pytest.raises(ScanWeaverTypeError, match="non-native byte order"):
        fn(_Dev((2, 4), 0x10000, ">f4"), 0.5, _Dev((2, 4), 0x20000))
    with pytest.raises(ScanWeaverTypeError, match="no valid typestr"):
        fn(_Dev((2, 4), 0x10000, "nonsense"), 0.5, _Dev((2, 4), 0x20000))
    assert not launches
    fn(a, 0.5, h)
    assert len(launches) == 1


@pytest.mark.parametrize("binding", BINDINGS)
def test_argument_count_and_keywords_are_type_errors(binding):
    driver, launches = _binding(binding)
    fn = _function(driver)
    a, h = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(ScanWeaverTypeError, match="@f takes 3 arguments, got 2"):
        fn(a, 0.5)
    with pytest.raises(ScanWeaverTypeError, match="@f takes 3 arguments, got 4"):
        fn(a, 0.5, h, h.copy())
    with pytest.raises(ScanWeaverTypeError, match=r"by position.*keyword argument\(s\) a, gamma, h"):
        fn(a=a, gamma=0.5, h=h)
    with pytest.raises(ScanWeaverTypeError, match="cannot use str as a CUDA stream"):
        fn(a, 0.5, h, stream="default")
    with pytest.raises(ScanWeaverValueError, match="stream handle -1 is negative"):
        fn(a, 0.5, h, stream=-1)
    assert not launches


@pytest.mark.parametrize("binding", BINDINGS)
def test_scalars_that_do_not_fit_are_value_errors(binding):
    driver, launches = _binding(binding)
    fn = _function(driver)
    a, h = np.ones((2, 4), np.float32), np.zeros((2, 4), np.float32)
    with pytest.raises(ScanWeaverValueError, match=r"'gamma' = 1e\+300 does not fit in f32"):
        fn(a, 1e300, h)
    with pytest.raises(ScanWeaverValueError, match="'gamma' = 1000.* does not fit in f32"):
        fn(a, 10**400, h)  # was an OverflowError from float()
    with pytest.raises(ScanWeaverTypeError, match="'gamma' must be a f32 number, got str"):
        fn(a, "0.5", h)
    assert not launches
    fn(a, float("inf"), h)  # an infinity the caller asked for is passed as such
    assert struct.unpack("<f", launches[-1].param_bytes[7])[0] == float("inf")


def test_a_bad_argument_of_a_later_kernel_launches_nothing():
    """Two kernels: the first writes `h`, the second reads `h` and writes `y`.  A wrong
    dtype of `y` used to be found at the second launch, after the first had written
    a device `h`: every launch is now checked before the first runs."""
    second = KernelLaunch(
        kernel_name="k1", module_name="m", grid=("y.shape[0]", 1, 1), block=(128, 1, 1), shared_bytes=0,
        args=[("h", "in", "f32", ("?", "?")), ("y", "out", "f32", ("?", "?"))], func_name="f", host_args=(2, 3),
    )
    drv = fake_cuda_bindings_driver(lambda image, name: SIZES if name == "k0" else [8] * 14)
    fn = _function(CudaPythonDriver(drv), [DESC, second], 4)
    a, h = _Dev((2, 4), 0x10000), _Dev((2, 4), 0x20000)
    with pytest.raises(ScanWeaverTypeError, match="kernel k1: argument 'y' must hold f32 elements"):
        fn(a, 0.5, h, _Dev((2, 4), 0x30000, "<i4"))
    with pytest.raises(ScanWeaverValueError, match="kernel k1: argument 'y' has element strides"):
        fn(a, 0.5, h, _Dev((2, 4), 0x30000, strides=(4, 8)))
    assert not drv.launches
    fn(a, 0.5, h, _Dev((2, 4), 0x30000))
    assert [launch.function[2] for launch in drv.launches] == [b"k0", b"k1"]


@pytest.mark.parametrize("binding", BINDINGS)
def test_addresses_and_sizes_beyond_32_bits_are_packed_exactly(binding):
    """Device arrays of more than 2^31 elements, high in the address space and at an
    offset of 2^33 bytes into an allocation: pointers and sizes are 64-bit values."""
    driver, launches = _binding(binding)
    fn = _function(driver)
    rows, cols = 2, 2**31 + 3
    base_a, base_h = 0x7F12_0000_0000, 0x7F40_0000_0000
    a = _Dev((rows, cols), base_a + 2**33)  # an offset view deep into a larger buffer
    h = _Dev((rows, cols), base_h)
    fn(a, 0.25, h)
    (launch,) = launches
    assert launch.grid == (2, 1, 1)
    assert launch.param_bytes == expected_bytes(base_a + 2**33, base_h, (rows, cols), 0.25)


@pytest.mark.parametrize("binding", BINDINGS)
def test_grids_over_cuda_limits_are_refused_not_wrapped(binding):
    driver, launches = _binding(binding)
    wide = KernelLaunch(
        kernel_name="k0", module_name="m", grid=("h.shape[0]*h.shape[1]", "a.shape[0]", 1), block=(128, 1, 1),
        shared_bytes=0, args=DESC.args, func_name="f", host_args=(0, 1, 2),
    )
    fn = _function(driver, [wide])
    with pytest.raises(ScanWeaverValueError, match=r"grid of \(4294967296, 1, 1\) blocks is over CUDA's limits"):
        fn(_Dev((1, 2**32), 0x10000), 0.5, _Dev((2**16, 2**16), 0x7F00_0000_0000))
    with pytest.raises(ScanWeaverValueError, match=r"grid of \(65536, 65536, 1\) blocks is over CUDA's limits"):
        fn(_Dev((65536, 1), 0x10000), 0.5, _Dev((65536, 1), 0x7F00_0000_0000))
    assert not launches
    fn(_Dev((65535, 1), 0x10000), 0.5, _Dev((2**31 - 1, 1), 0x7F00_0000_0000))
    assert launches[-1].grid == (2**31 - 1, 65535, 1)


@pytest.mark.parametrize("binding", BINDINGS)
def test_device_array_interfaces_no_kernel_could_honour(binding):
    """Negative sizes passed the checks and made a negative grid (the driver reads it
    unsigned: 2^32 - 1 blocks); strides shorter than the rank passed as C-contiguous and
    packed a short descriptor; a read-only output was written; a mask was ignored."""
    driver, launches = _binding(binding)
    fn = _function(driver)
    a = _Dev((2, 4), 0x10000)
    cases = [
        (_Dev((-1, 4), 0x20000), ScanWeaverValueError, r"sizes \(-1, 4\) outside 0..2\^63-1"),
        (_Dev((2, 2**64 + 4), 0x20000), ScanWeaverValueError, "outside 0..2\\^63-1"),  # c_int64 would wrap it to 4
        (_Dev((2, 4), 2**64 + 0x20000), ScanWeaverValueError, "an address beyond 64 bits"),
        (_Dev((2, 4), 0x20000, strides=(4,)), ScanWeaverValueError, "has 1 strides for 2 dimensions"),
        (_Dev((2, 4), 0), ScanWeaverValueError, "has no data pointer"),
    ]
    for h, error, message in cases:
        with pytest.raises(error, match=message):
            fn(a, 0.5, h)
    readonly = _Dev((2, 4), 0x20000)
    readonly.__cuda_array_interface__["data"] = (0x20000, True)
    with pytest.raises(ScanWeaverValueError, match="argument #2 is written by the kernel but its device array is read-only"):
        fn(a, 0.5, readonly)
    masked = _Dev((2, 4), 0x20000)
    masked.__cuda_array_interface__["mask"] = _Dev((2, 4), 0x30000, "|b1")
    with pytest.raises(ScanWeaverTypeError, match="masked device arrays are not supported"):
        fn(a, 0.5, masked)
    assert not launches
    readonly_input = _Dev((2, 4), 0x10000)
    readonly_input.__cuda_array_interface__["data"] = (0x10000, True)
    fn(readonly_input, 0.5, _Dev((0, 4), 0))  # a read-only input, an empty output with no data
    fn(readonly_input, 0.5, _Dev((2, 4), 0x20000))
    assert len(launches) == 1


def test_errors_of_the_numba_bindings_are_cuda_driver_errors():
    """numba raises its own classes (CudaAPIError, LinkerError): they reached the caller
    as such, unlike cuda-python's results, which were already `CudaDriverError`s."""
    from scanweaver.runtime.cuda_driver import CudaDriverError

    class CudaAPIError(Exception):
        pass

    def failing_launch(*args, **kwargs):
        raise CudaAPIError("[700] CUDA_ERROR_ILLEGAL_ADDRESS")

    cuda = fake_numba_cuda("Built-in")
    fn = _function(NumbaDriver(cuda, failing_launch))
    with pytest.raises(CudaDriverError, match=r"launching k0 failed in the numba binding: CudaAPIError: \[700\]"):
        fn(np.ones((2, 4), np.float32), 0.5, np.zeros((2, 4), np.float32))

    def failing_ptx(ptx):
        raise CudaAPIError("LinkerError: ptxas application ptx input, line 1; fatal")

    cuda.current_context = lambda: type("Ctx", (), {"create_module_ptx": staticmethod(failing_ptx)})()
    with pytest.raises(CudaDriverError, match="loading the module failed in the numba binding: CudaAPIError"):
        CudaModule("// ptx\n", driver=NumbaDriver(cuda, failing_launch))


def test_allocation_failures_are_cuda_driver_errors():
    """A scratch buffer of 2^63 elements: its int64 byte count wrapped and a 1-byte
    allocation stood for it (the kernel would have written far past it); now the
    allocation is asked for whole, and the binding's failure is one CudaDriverError."""
    from scanweaver.runtime.cuda_driver import CudaDriverError

    scratch = KernelLaunch(
        kernel_name="k0", module_name="m", grid=("h.shape[0]", 1, 1), block=(128, 1, 1), shared_bytes=0,
        args=[*DESC.args, ("agg", "out", "f32", ("?",))], func_name="f", host_args=(0, 1, 2, -2),
        scratch=(("agg", ("expr:mul(h.shape[0],4611686018427387904)",)),),
    )
    driver, launches = _binding("numba", SIZES + [8] * 5)
    fn = _function(driver, [scratch])
    with pytest.raises(CudaDriverError, match=r"allocating scratch 'agg' of shape \(9223372036854775808,\) failed"):
        fn(np.ones((2, 4), np.float32), 0.5, np.zeros((2, 4), np.float32))
    assert not launches
