//! Memory by library: every device-pool allocation is counted under the
//! loaded object (a shared library, or the program) whose code called it, by
//! the call's return address: bytes in use now, the most in use at once, and
//! allocations; and the calls the real allocator answered instead, with
//! their bytes. A call site is resolved to its object once, at its first
//! allocation (`resolve`: the front door's `dladdr`); after that an
//! allocation or a free finds the site's library in a lock-free table and
//! updates its counters.
//!
//! An object is named as a user recognises it (`object_name`): a shared
//! library by its file name (`libc10_cuda.so`, `libcublas.so.13`); any other
//! object inside a Python package tree, such as an extension module, by its
//! path there, which begins with its package
//! (`cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so`, where
//! the file name alone says nothing); anything else (the program) by its
//! file name.

use std::fmt::Write;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use super::locks::lock;
use super::stats::{add_saturating, raise_peak};

/// Call sites remembered (a power of two); allocations from sites past
/// these count as the unknown caller's.
const SITES: usize = 4096;
/// Slots a site is looked for in before it counts as unknown.
const PROBES: usize = 32;
/// Libraries counted apart, the unknown caller and "other libraries" included.
const LIBRARIES: usize = 64;
const UNKNOWN: usize = 0;
const OTHER: usize = LIBRARIES - 1;
const OTHER_NAME: &str = "(other libraries)";
const UNRESOLVED: u32 = u32::MAX;
/// The directories Python installs packages in: an object below one is named
/// by its path there.
const PACKAGE_TREES: [&str; 2] = ["/site-packages/", "/dist-packages/"];

/// One library's figures, on a cache line of their own: threads allocating
/// for different libraries do not contend.
#[derive(Default)]
#[repr(align(64))]
struct Counters {
    in_use: AtomicU64,
    peak: AtomicU64,
    allocations: AtomicU64,
    passed_calls: AtomicU64,
    passed_bytes: AtomicU64,
}

/// A call site: its return address (0: a free slot) and its library's index.
struct Site {
    caller: AtomicUsize,
    library: AtomicU32,
}

/// One library's figures, as reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LibraryFigures {
    /// The object's name (`object_name`).
    pub name: String,
    pub in_use: u64,
    pub peak: u64,
    pub allocations: u64,
    /// Allocations the real allocator answered, and their bytes.
    pub passed_calls: u64,
    pub passed_bytes: u64,
}

pub struct Libraries {
    /// Allocations are counted (`SOMA_BY_LIBRARY`); if not, every figure stays 0.
    counting: bool,
    /// The file of the object holding an address, if any.
    resolve: fn(usize) -> Option<String>,
    sites: Box<[Site]>,
    counters: Box<[Counters]>,
    /// By index; below `OTHER`, so that it can be counted apart.
    names: Mutex<Vec<String>>,
}

impl Libraries {
    pub fn new(counting: bool, resolve: fn(usize) -> Option<String>) -> Libraries {
        let sites = (0..SITES).map(|_| Site { caller: AtomicUsize::new(0), library: AtomicU32::new(UNRESOLVED) });
        Libraries {
            counting,
            resolve,
            sites: sites.collect(),
            counters: (0..LIBRARIES).map(|_| Counters::default()).collect(),
            names: Mutex::new(vec!["(unknown caller)".to_string()]),
        }
    }

    /// A pool allocation of `size` bytes called from `caller`.
    pub fn allocated(&self, caller: usize, size: u64) {
        if !self.counting {
            return;
        }
        let counters = &self.counters[self.library_of(caller)];
        let in_use = counters.in_use.fetch_add(size, Relaxed) + size;
        raise_peak(&counters.peak, in_use);
        counters.allocations.fetch_add(1, Relaxed);
    }

    /// A pool block of `size` bytes allocated from `caller` is no longer in
    /// use (freed, or gone with a reset).
    pub fn freed(&self, caller: usize, size: u64) {
        if !self.counting {
            return;
        }
        self.counters[self.library_of(caller)].in_use.fetch_sub(size, Relaxed);
    }

    /// An allocation of `size` bytes from `caller` that the real allocator
    /// answered.
    pub fn passed_through(&self, caller: usize, size: u64) {
        if !self.counting {
            return;
        }
        let counters = &self.counters[self.library_of(caller)];
        counters.passed_calls.fetch_add(1, Relaxed);
        add_saturating(&counters.passed_bytes, size);
    }

    /// The name of the library of call site `caller`.
    pub fn name_of(&self, caller: usize) -> String {
        let index = self.library_of(caller);
        lock(&self.names).get(index).cloned().unwrap_or_else(|| OTHER_NAME.to_string())
    }

    /// Every library that allocated, in the order they were first seen (a
    /// library keeps its place: the list only grows).
    pub fn figures(&self) -> Vec<LibraryFigures> {
        let names = lock(&self.names).clone();
        let name_of = |index: usize| names.get(index).cloned().unwrap_or_else(|| OTHER_NAME.to_string());
        (0..LIBRARIES)
            .filter(|&index| index < names.len() || index == OTHER)
            .map(|index| {
                let c = &self.counters[index];
                LibraryFigures {
                    name: name_of(index),
                    in_use: c.in_use.load(Relaxed),
                    peak: c.peak.load(Relaxed),
                    allocations: c.allocations.load(Relaxed),
                    passed_calls: c.passed_calls.load(Relaxed),
                    passed_bytes: c.passed_bytes.load(Relaxed),
                }
            })
            .filter(|f| f.allocations > 0 || f.passed_calls > 0)
            .collect()
    }

    /// Every library that allocated, the most in use first (then the highest peak).
    pub fn figures_by_use(&self) -> Vec<LibraryFigures> {
        let mut figures = self.figures();
        figures.sort_by(|a, b| (b.in_use, b.peak, &a.name).cmp(&(a.in_use, a.peak, &b.name)));
        figures
    }

    /// The `SOMA_STATS` section: one row a library.
    pub fn report(&self, out: &mut String) {
        let figures = self.figures_by_use();
        if figures.is_empty() {
            return;
        }
        // A column of 28, wider for a longer name (a path in a package tree).
        let width = figures.iter().map(|f| f.name.len() + 2).max().unwrap_or(0).max(28);
        let _ = writeln!(out, "device memory by library (the object that called the allocation)");
        let _ = writeln!(out, "  {:<width$}{:>12}{:>12}{:>13}  {}", "library", "in use", "peak", "allocations", "passed through");
        for f in figures {
            let passed = if f.passed_calls > 0 { format!("{} ({})", f.passed_calls, mib(f.passed_bytes)) } else { "0".into() };
            let _ = writeln!(out, "  {:<width$}{:>12}{:>12}{:>13}  {}", f.name, mib(f.in_use), mib(f.peak), f.allocations, passed);
        }
    }

    /// The index of the library of call site `caller`, resolved the first
    /// time the site is seen (by every thread that sees it unresolved: the
    /// answer is the same).
    fn library_of(&self, caller: usize) -> usize {
        if caller == 0 {
            return UNKNOWN;
        }
        // Fibonacci hashing (the top bits, as many as index SITES): return
        // addresses differ in their low bits.
        let start = (caller as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - SITES.trailing_zeros());
        for probe in 0..PROBES {
            let site = &self.sites[(start as usize + probe) % SITES];
            let seen = match site.caller.load(Relaxed) {
                0 => match site.caller.compare_exchange(0, caller, Relaxed, Relaxed) {
                    Ok(_) => caller,
                    Err(other) => other,
                },
                seen => seen,
            };
            if seen == caller {
                return match site.library.load(Relaxed) {
                    UNRESOLVED => {
                        let library = self.intern((self.resolve)(caller));
                        site.library.store(library as u32, Relaxed);
                        library
                    }
                    library => library as usize,
                };
            }
        }
        UNKNOWN
    }

    /// The index of the object file `path` (by its name, `object_name`).
    fn intern(&self, path: Option<String>) -> usize {
        let Some(path) = path else { return UNKNOWN };
        let name = object_name(&path).to_string();
        let mut names = lock(&self.names);
        if let Some(index) = names.iter().position(|known| *known == name) {
            return index;
        }
        if names.len() == OTHER {
            return OTHER;
        }
        names.push(name);
        names.len() - 1
    }
}

/// The name of the object file at `path`: a shared library's file name
/// (`lib*`); for another object inside a Python package tree, the shortest
/// path that names its package: its path below the innermost tree; else its
/// file name.
fn object_name(path: &str) -> &str {
    let file = path.rsplit('/').next().unwrap_or(path);
    if file.starts_with("lib") {
        return file;
    }
    let below_trees = PACKAGE_TREES.iter().filter_map(|tree| path.rfind(tree).map(|at| &path[at + tree.len()..]));
    below_trees.min_by_key(|below| below.len()).unwrap_or(file)
}

/// In MiB, to a tenth: one unit down the column, libraries compared at a glance.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Addresses 0x1000.. belong to "libtorch_cuda.so", 0x2000.. to
    /// "libnccl.so.2", 0x3000.. to the program, the rest to nothing.
    fn fake_objects(address: usize) -> Option<String> {
        match address >> 12 {
            1 => Some("/usr/lib/libtorch_cuda.so".into()),
            2 => Some("/opt/nccl/libnccl.so.2".into()),
            3 => Some("/home/user/app".into()),
            _ => None,
        }
    }

    fn figures_of<'a>(figures: &'a [LibraryFigures], name: &str) -> &'a LibraryFigures {
        figures.iter().find(|f| f.name == name).unwrap_or_else(|| panic!("{name} in {figures:?}"))
    }

    #[test]
    fn allocations_are_counted_under_the_object_that_called_them() {
        let libraries = Libraries::new(true, fake_objects);
        libraries.allocated(0x1010, 100);
        libraries.allocated(0x1020, 50); // another site of the same library
        libraries.allocated(0x2010, 7);
        libraries.allocated(0x3010, 1);
        libraries.freed(0x1010, 100);
        libraries.allocated(0x1010, 30);
        libraries.passed_through(0x2010, 1 << 20);
        libraries.allocated(0x9999, 5); // in no object
        libraries.allocated(0, 5); // no return address
        let figures = libraries.figures_by_use();
        let torch = figures_of(&figures, "libtorch_cuda.so");
        assert_eq!((torch.in_use, torch.peak, torch.allocations), (80, 150, 3));
        let nccl = figures_of(&figures, "libnccl.so.2");
        assert_eq!((nccl.in_use, nccl.passed_calls, nccl.passed_bytes), (7, 1, 1 << 20));
        assert_eq!(figures_of(&figures, "app").in_use, 1);
        assert_eq!(figures_of(&figures, "(unknown caller)").allocations, 2);
        let order: Vec<&str> = figures.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(order, ["libtorch_cuda.so", "(unknown caller)", "libnccl.so.2", "app"], "most in use first");
        let seen: Vec<String> = libraries.figures().into_iter().map(|f| f.name).collect();
        assert_eq!(seen, ["(unknown caller)", "libtorch_cuda.so", "libnccl.so.2", "app"], "in the order first seen");
        let mut table = String::new();
        libraries.report(&mut table);
        assert!(table.lines().nth(2).is_some_and(|row| row.contains("libtorch_cuda.so")), "{table}");
    }

    #[test]
    fn objects_in_a_python_package_tree_are_named_by_their_path_there() {
        let cupy = "/home/u/.venv/lib/python3.12/site-packages/cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so";
        assert_eq!(object_name(cupy), "cupy_backends/cuda/api/runtime.cpython-312-x86_64-linux-gnu.so");
        let debian = "/usr/lib/python3/dist-packages/numpy/_core/_multiarray_umath.cpython-312-x86_64-linux-gnu.so";
        assert_eq!(object_name(debian), "numpy/_core/_multiarray_umath.cpython-312-x86_64-linux-gnu.so");
        let nested = "/usr/lib/python3/dist-packages/tool/site-packages/pkg/_ext.abi3.so";
        assert_eq!(object_name(nested), "pkg/_ext.abi3.so", "the innermost tree names the package");
        let top_level = "/opt/conda/lib/python3.12/site-packages/_cffi_backend.cpython-312-x86_64-linux-gnu.so";
        assert_eq!(object_name(top_level), "_cffi_backend.cpython-312-x86_64-linux-gnu.so");
        // Libraries keep their file names, in a package tree or not.
        assert_eq!(object_name("/x/site-packages/torch/lib/libc10_cuda.so"), "libc10_cuda.so");
        assert_eq!(object_name("/x/site-packages/nvidia/cublas/lib/libcublas.so.13"), "libcublas.so.13");
        assert_eq!(object_name("/usr/lib/x86_64-linux-gnu/libcufft.so.12"), "libcufft.so.12");
        assert_eq!(object_name("/home/user/app"), "app");
        assert_eq!(object_name("/home/user/site-packages-notes/app"), "app", "a tree is a whole directory name");
    }

    #[test]
    fn a_long_name_widens_the_column() {
        fn in_a_package(_: usize) -> Option<String> {
            Some("/v/site-packages/somepkg/sub/alloc.cpython-312-x86_64-linux-gnu.so".into())
        }
        let libraries = Libraries::new(true, in_a_package);
        libraries.allocated(0x1010, 3 << 20);
        let mut table = String::new();
        libraries.report(&mut table);
        let row = table.lines().nth(2).unwrap_or_default();
        assert!(row.starts_with("  somepkg/sub/alloc.cpython-312-x86_64-linux-gnu.so       3.0 MiB"), "{table}");
        let header = table.lines().nth(1).unwrap_or_default();
        assert_eq!(header.find("in use").map(|at| at + "in use".len()), row.find("MiB").map(|at| at + "MiB".len()), "{table}");
    }

    #[test]
    fn with_counting_off_no_library_is_counted_or_resolved() {
        fn never(_: usize) -> Option<String> {
            panic!("nothing is resolved on the allocation path when counting is off")
        }
        let libraries = Libraries::new(false, never);
        libraries.allocated(0x1010, 100);
        libraries.passed_through(0x1010, 100);
        libraries.freed(0x1010, 100);
        assert!(libraries.figures().is_empty());
        let mut table = String::new();
        libraries.report(&mut table);
        assert!(table.is_empty(), "{table}");
    }

    #[test]
    fn a_site_is_resolved_once_and_more_libraries_than_the_table_share_a_row() {
        use std::sync::atomic::AtomicUsize;
        static RESOLVED: AtomicUsize = AtomicUsize::new(0);
        fn one_object_per_page(address: usize) -> Option<String> {
            RESOLVED.fetch_add(1, Relaxed);
            Some(format!("/lib/lib{}.so", address >> 12))
        }
        let libraries = Libraries::new(true, one_object_per_page);
        for _ in 0..3 {
            libraries.allocated(0x1_0008, 1);
        }
        assert_eq!(RESOLVED.load(Relaxed), 1, "a site's library is looked up once");
        for page in 0..2 * LIBRARIES {
            libraries.allocated((page + 100) << 12, 1);
        }
        let figures = libraries.figures();
        assert_eq!(figures.len(), LIBRARIES - 1, "every slot but the unknown caller's, which has nothing");
        let other = figures_of(&figures, "(other libraries)");
        assert_eq!(other.allocations as usize, 2 * LIBRARIES - (LIBRARIES - 3));
        let total: u64 = figures.iter().map(|f| f.in_use).sum();
        assert_eq!(total as usize, 3 + 2 * LIBRARIES, "every byte counted somewhere");
    }

    #[test]
    fn threads_allocating_from_many_sites_lose_no_byte() {
        let libraries = Libraries::new(true, fake_objects);
        std::thread::scope(|scope| {
            for thread in 0..8usize {
                let libraries = &libraries;
                scope.spawn(move || {
                    for i in 0..10_000usize {
                        let site = 0x1000 + (thread * 64 + i % 64) * 8;
                        libraries.allocated(site, 3);
                        if i % 2 == 0 {
                            libraries.freed(site, 3);
                        }
                    }
                });
            }
        });
        let figures = libraries.figures();
        let torch = figures_of(&figures, "libtorch_cuda.so");
        assert_eq!((torch.in_use, torch.allocations), (8 * 5_000 * 3, 80_000));
    }
}
