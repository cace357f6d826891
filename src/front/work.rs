//! The driver calls that issue work on a stream (kernels, copies, sets,
//! memory operations, graphs, host functions): each export (`lib.rs`,
//! `work_entry_points!`) runs the real call inside `issue`, so that the core
//! knows which non-blocking streams have work and can issue a barrier's wait
//! on a stream just before its next work (`core/streams.rs`).
//!
//! The runtime issues its work through these entry points too (it asks
//! `cuGetProcAddress` for them, like every driver function), so one list
//! covers runtime, static-runtime and driver-API programs. The list is that
//! of CUDA 13.0's `cuda.h`, `cudaGL.h`: every function that takes a stream
//! and issues anything on it but an event record or wait, checked against
//! the headers by `scripts/check_work_entry_points.py` (`make test`). A newer
//! driver may have more, so work is tracked only where the driver is no newer.

use std::ffi::c_void;
use std::sync::OnceLock;

use cudarc::driver::sys::{CUlaunchConfig, CUDA_LAUNCH_PARAMS};

use crate::core::allocator::state::Allocator;
use crate::core::config::settings::Config;
use crate::cuda::driver;
use crate::cuda::gpu::Stream;

/// What a null stream names in a call (each export's, `lib.rs`).
pub use crate::core::streams::NullStream;

/// `CUDA_VERSION` of the headers the list of entry points was checked against.
pub const CHECKED_CUDA_VERSION: i32 = 13000;

/// Runs `real`, a driver call that issues work on `streams` (`null`: what a
/// null handle names there), between the core's steps for them
/// (`Allocator::issue_work`) where work is tracked.
pub fn issue(allocator: &Allocator, null: NullStream, streams: &[Stream], real: impl FnOnce() -> u32) -> u32 {
    match driver::loaded() {
        Some(driver) if tracked(&allocator.config) => allocator.issue_work(driver, streams, null, real),
        _ => real(),
    }
}

/// Runs `real` as `issue` would when the hooks are passed by (a call made
/// inside a hook, or after a hook failed): the work is still noted.
pub fn issue_past_hooks(
    allocator: Option<&Allocator>,
    null: NullStream,
    streams: &[Stream],
    real: impl FnOnce() -> u32,
) -> u32 {
    let rc = real();
    if let Some(allocator) = allocator.filter(|allocator| tracked(&allocator.config)) {
        allocator.note_work(streams, null);
    }
    rc
}

/// What a null stream handle names in the export `name`: the per-thread
/// default stream in a `_ptsz` or `_ptds` variant. Evaluated when the shim
/// is built, once per export.
pub const fn null_stream(name: &str) -> NullStream {
    if ends_with(name.as_bytes(), b"_ptsz") || ends_with(name.as_bytes(), b"_ptds") {
        NullStream::PerThread
    } else {
        NullStream::Legacy
    }
}

/// `str::ends_with`, usable in a constant.
const fn ends_with(name: &[u8], suffix: &[u8]) -> bool {
    if name.len() < suffix.len() {
        return false;
    }
    let start = name.len() - suffix.len();
    let mut i = 0;
    while i < suffix.len() {
        if name[start + i] != suffix[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The stream of a `_ptds` call, which names none: the calling thread's
/// per-thread default stream.
pub fn per_thread_stream() -> [Stream; 1] {
    [Stream(std::ptr::null_mut())]
}

/// The stream a handle passed as an integer argument names.
pub fn stream(handle: usize) -> Stream {
    Stream(handle as *mut c_void)
}

/// Whether work on streams is tracked: asked for
/// (`SOMA_TRACK_WORK`, and not `SOMA_DISABLE=1`), and the driver is no newer than the CUDA whose entry
/// points the shim wraps (a newer one may issue work through one the shim
/// does not know). Decided once, before the first stream is registered.
pub fn tracked(config: &Config) -> bool {
    static TRACKED: OnceLock<bool> = OnceLock::new();
    *TRACKED.get_or_init(|| {
        if !config.track_work || config.disable {
            return false;
        }
        match driver::loaded().map(|driver| driver.version()) {
            Some(Ok(version)) if version <= CHECKED_CUDA_VERSION => true,
            found => {
                log::info!("work on streams not tracked: driver version {found:?}, entry points known up to {CHECKED_CUDA_VERSION}");
                false
            }
        }
    })
}

/// The stream of `cuLaunchKernelEx`'s launch configuration.
/// SAFETY: `config` is null or points to a `CUlaunchConfig` (the call's contract).
pub unsafe fn launch_config_stream(config: usize) -> [Stream; 1] {
    let config = config as *const CUlaunchConfig;
    // SAFETY: as the caller promises. A null configuration names the legacy
    // stream here, which is never tracked (the call fails anyway).
    [unsafe { config.as_ref() }.map_or(Stream::LEGACY, |config| Stream(config.hStream.cast()))]
}

/// The streams of `cuLaunchCooperativeKernelMultiDevice`'s launches.
/// SAFETY: `list` is null or points to `count` `CUDA_LAUNCH_PARAMS` (the call's contract).
pub unsafe fn launch_list_streams(list: usize, count: usize) -> Vec<Stream> {
    let list = list as *const CUDA_LAUNCH_PARAMS;
    // An `unsigned int` in a 64-bit register: the upper half is undefined.
    let count = count as u32 as usize;
    if list.is_null() {
        return Vec::new();
    }
    // SAFETY: as the caller promises.
    let launches = unsafe { std::slice::from_raw_parts(list, count) };
    launches.iter().map(|launch| Stream(launch.hStream.cast())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_null_stream_is_the_per_thread_one_in_per_thread_variants_only() {
        for name in ["cuLaunchKernel_ptsz", "cuMemcpyHtoD_v2_ptds", "cuMemsetD8Async_ptsz"] {
            assert_eq!(null_stream(name), NullStream::PerThread, "{name}");
        }
        for name in ["cuLaunchKernel", "cuMemcpyHtoDAsync_v2", "_ptsz_not_at_the_end", "ptsz", ""] {
            assert_eq!(null_stream(name), NullStream::Legacy, "{name}");
        }
    }
}
