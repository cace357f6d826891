//! Which library called an allocation, for `SOMA_PASSTHROUGH_CALLERS`, memory
//! by library and the message when pool memory reaches CUDA IPC.
//!
//! `cudaMalloc` and `cuMemAlloc_v2` are entered through two-instruction
//! trampolines (lib.rs) that pass their return address along; it is turned
//! into the calling object's file name only when a name is needed, from a
//! table of the loaded objects' address ranges (`dl_iterate_phdr`), made
//! again only when an address falls in none of them: a library loaded since.

use std::collections::HashMap;
use std::ffi::{c_int, c_void, CStr};
use std::sync::{Arc, Mutex, RwLock};

use crate::core::locks::lock;

/// One loaded object's segment: its addresses `[start, end)` and its file.
struct Range {
    start: usize,
    end: usize,
    file: Arc<str>,
}

/// The loaded objects' segments, by start address.
static LOADED: RwLock<Vec<Range>> = RwLock::new(Vec::new());

/// The file of the loaded object containing `address`, if any.
pub fn object_of(address: usize) -> Option<String> {
    if address == 0 {
        return None;
    }
    if let Some(file) = find(&LOADED.read().unwrap_or_else(|e| e.into_inner()), address) {
        return Some(file);
    }
    let mut ranges = LOADED.write().unwrap_or_else(|e| e.into_inner());
    // Another thread may have made it again meanwhile.
    if let Some(file) = find(&ranges, address) {
        return Some(file);
    }
    *ranges = loaded_ranges();
    find(&ranges, address)
}

fn find(ranges: &[Range], address: usize) -> Option<String> {
    let after = ranges.partition_point(|range| range.start <= address);
    let range = ranges[..after].last()?;
    (address < range.end).then(|| range.file.to_string())
}

/// Every loaded object's loadable segments, sorted; the program's own under
/// its executable's path.
fn loaded_ranges() -> Vec<Range> {
    let program: Arc<str> = std::env::current_exe().map(|path| path.to_string_lossy().into()).unwrap_or_else(|_| "".into());
    let mut found: (Vec<Range>, Arc<str>) = (Vec::new(), program);
    // SAFETY: the callback gets only `found`, which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(add_object), (&mut found as *mut (Vec<Range>, Arc<str>)).cast()) };
    let mut ranges = found.0;
    ranges.sort_by_key(|range| range.start);
    ranges
}

/// `dl_iterate_phdr`'s callback: `data` is the `(ranges, program path)` being made.
unsafe extern "C" fn add_object(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: the loader passes a valid `info` for the call, and `data` is
    // `loaded_ranges`'s pair, borrowed by no one else meanwhile.
    let (info, (ranges, program)) = unsafe { (&*info, &mut *data.cast::<(Vec<Range>, Arc<str>)>()) };
    let name = if info.dlpi_name.is_null() {
        ""
    } else {
        // SAFETY: a NUL-terminated name owned by the loader.
        unsafe { CStr::from_ptr(info.dlpi_name) }.to_str().unwrap_or("")
    };
    // The program itself has no name here (nor has the vDSO, which allocates nothing).
    let file: Arc<str> = if !name.is_empty() {
        name.into()
    } else if ranges.is_empty() {
        program.clone()
    } else {
        return 0;
    };
    if info.dlpi_phdr.is_null() {
        return 0;
    }
    // SAFETY: `dlpi_phdr` is non-null and holds `dlpi_phnum` program headers.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    for header in headers.iter().filter(|header| header.p_type == libc::PT_LOAD) {
        let start = info.dlpi_addr as usize + header.p_vaddr as usize;
        ranges.push(Range { start, end: start + header.p_memsz as usize, file: file.clone() });
    }
    0
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

    #[test]
    fn addresses_resolve_to_their_shared_object_and_none_outside() {
        let in_libc = libc::malloc as *const () as usize;
        let path = object_of(in_libc).expect("libc is loaded");
        assert!(path.rsplit('/').next().unwrap().starts_with("libc"), "{path}");
        let on_the_heap = Box::new(0u64);
        assert_eq!(object_of(&*on_the_heap as *const u64 as usize), None, "heap memory is in no object");
        let here = addresses_resolve_to_their_shared_object_and_none_outside as *const () as usize;
        assert_eq!(object_of(here), std::env::current_exe().ok().map(|p| p.to_string_lossy().into_owned()));
    }
}
