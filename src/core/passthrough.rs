//! Every reason a call goes to the real function untouched.

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passthrough {
    /// `SOMA_DISABLE=1`.
    Disabled,
    /// `cudaMalloc(&p, 0)`: the real one answers `NULL` and success.
    ZeroSize,
    /// `cudaMalloc(NULL, n)`: the real one returns the error and sets it.
    NullOutPointer,
    /// Outside `SOMA_MIN_BYTES`..`SOMA_MAX_BYTES`.
    SizeOutOfRange,
    /// A stream capture is in progress: the real function gives the result a
    /// capture expects (an error that invalidates it, or success in relaxed mode).
    StreamCapture,
    /// No driver in the process, or no context could be made current: the
    /// real function reports the error the program expects.
    NoContext,
    /// The device has no pool support, or its pool could not be set up.
    NoPoolSupport,
    /// The current context is one of the program's own, not the device's primary one.
    ForeignContext,
    /// The pool stayed out of memory after waiting for frees and trimming.
    PoolOutOfMemory,
    /// The pool failed for another reason (logged).
    PoolError,
    /// `cuMemAllocPitch` with an element size it refuses (not 4, 8 or 16).
    InvalidElementSize,
    /// `SOMA_PASSTHROUGH_CALLERS` names the library that called.
    Caller,
    /// A call made by the shim itself into the runtime: never pooled twice.
    Reentrant,
    /// Pinned host memory with `SOMA_HOST_POOL=0`.
    HostPoolOff,
    /// Pinned host memory where the driver or device has no host memory pools.
    NoHostPoolSupport,
    /// Pinned host memory in a process that sees several devices: the host
    /// pool's frees are ordered after one device's streams only.
    SeveralDevices,
    /// `cudaHostAllocWriteCombined`: a host pool gives cached memory only.
    WriteCombined,
    /// Host allocation flags the shim does not know (the real call refuses them).
    UnknownHostFlags,
}
