//! Which library called an allocation, for `SOMA_PASSTHROUGH_CALLERS` and for
//! the message when pool memory reaches CUDA IPC.
//!
//! `cudaMalloc` and `cuMemAlloc_v2` are entered through two-instruction
//! trampolines (lib.rs) that pass their return address along; it is turned
//! into the calling object's file name only when a name is needed.

use std::collections::HashMap;
use std::ffi::CStr;
use std::sync::Mutex;

use crate::core::locks::lock;

/// The file of the loaded object containing `address`, if any.
pub fn object_of(address: usize) -> Option<String> {
    // SAFETY: all-zero is a valid Dl_info; dladdr only reads the address.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for any address, or returns 0.
    if address == 0 || unsafe { libc::dladdr(address as *const libc::c_void, &mut info) } == 0 {
        return None;
    }
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    Some(unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned())
}

/// Whether a library file matches one of the configured names: a name
/// matches a file whose base name starts with it (`libnccl` matches
/// `/usr/lib/libnccl.so.2`; a program's own name matches the program).
pub fn matches(path: &str, names: &[String]) -> bool {
    let base = path.rsplit('/').next().unwrap_or(path);
    names.iter().any(|name| base.starts_with(name.as_str()))
}

/// Remembers, per calling address, whether its library is one of `names`:
/// allocation sites are few, so each is looked up once.
#[derive(Default)]
pub struct CallerFilter {
    seen: Mutex<HashMap<usize, bool>>,
}

impl CallerFilter {
    pub fn is_listed(&self, caller: usize, names: &[String]) -> bool {
        let mut seen = lock(&self.seen);
        *seen.entry(caller).or_insert_with(|| object_of(caller).is_some_and(|path| matches(&path, names)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_start_of_the_base_name() {
        let names = vec!["libnccl".to_string(), "ipc".to_string()];
        assert!(matches("/usr/lib/x86_64-linux-gnu/libnccl.so.2", &names));
        assert!(matches("/home/user/app/build/gpu/ipc", &names));
        assert!(!matches("/usr/lib/libcudnn.so.9", &names));
        assert!(!matches("/opt/libnccl/libfoo.so", &names), "directories do not count");
        assert!(!matches("/usr/lib/libnccl.so.2", &[]));
    }

    #[test]
    fn an_address_in_this_test_binary_is_found_and_cached() {
        let here = an_address_in_this_test_binary_is_found_and_cached as *const () as usize;
        let path = object_of(here).expect("the test binary is a loaded object");
        let base = path.rsplit('/').next().unwrap().to_string();
        let filter = CallerFilter::default();
        assert!(filter.is_listed(here, std::slice::from_ref(&base)));
        assert!(filter.is_listed(here, &["no-such-library".to_string()]), "the first answer is kept per address");
        assert!(!CallerFilter::default().is_listed(here, &["no-such-library".to_string()]));
        assert_eq!(object_of(0), None);
    }
}
