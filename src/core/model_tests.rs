//! The ordering contract, checked on the simulated GPU (`model`).
//!
//! A random program (allocations, kernels on every kind of stream, frees,
//! streams made and destroyed, captures in every mode, resets, host
//! synchronizations) runs against the allocator core while the GPU completes
//! work in a random order. The model flags any program work that runs while
//! work issued before the free of an earlier owner of the same block is
//! unfinished, any capture the shim joins or invalidates, and any misuse of
//! the driver; the harness checks the pending-free bound after each
//! allocation. The same harness run on a naive shim (free on the legacy
//! stream alone) must find violations: the checks have teeth.
//!
//! Programs come in two scales: a 64 MiB GPU with blocks of 1-3 MiB, and a
//! 1 GiB GPU with blocks up to 96 MiB and up to 32 streams, where frees pass
//! the default `SOMA_PENDING_FREE_LIMIT` as large programs' do. The search is
//! as deep as `PROPTEST_CASES` says (300 cases a property by default; `make
//! stress` runs far more) from the seed `PROPTEST_RNG_SEED` (fixed by
//! default, so that `make test` never fails on a case found by chance). A
//! run is deterministic for a given program and seed; proptest saves each
//! failure found in `proptest-regressions/`, replayed first by every run.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::RngSeed;

use super::allocator::free::Freed;
use super::allocator::state::Allocator;
use super::config::settings::Config;
use super::ptrmap::{Memory, MemoryKind};
use super::model::{CaptureMode, SimGpu, Touch, PER_THREAD};
use super::streams::NullStream;
use crate::cuda::gpu::{Gpu, Pool, Stream};

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 64 * MIB;

/// The size of the simulated GPU and of the program run on it.
#[derive(Clone, Copy, Debug)]
struct Scale {
    capacity: u64,
    /// Blocks of up to 96 MiB: their frees pass the default pending limit.
    large_blocks: bool,
    /// The most streams the program has at once, the two default ones included.
    streams: usize,
}

const SMALL: Scale = Scale { capacity: CAPACITY, large_blocks: false, streams: 12 };
const LARGE: Scale = Scale { capacity: 1 << 30, large_blocks: true, streams: 32 };

/// The search's depth and seed (see the module doc).
fn search() -> ProptestConfig {
    let mut config = ProptestConfig::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = 300;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        config.rng_seed = RngSeed::Fixed(0x5eed_0f_50ba);
    }
    config
}

/// The allocator under test, as the front doors drive it.
trait Shim {
    /// A pool block, or None where the call goes to the real allocator.
    fn malloc(&self, gpu: &SimGpu, size: u64) -> Option<u64>;
    /// `cudaFree` of a block `malloc` returned.
    fn free(&self, gpu: &SimGpu, ptr: u64);
    /// `cudaFreeAsync` of a block `malloc` returned.
    fn free_async(&self, gpu: &SimGpu, ptr: u64, stream: Stream);
    fn stream_created(&self, gpu: &SimGpu, stream: Stream);
    /// A kernel on `stream`, through the shim's hook on work; `touch` None:
    /// one issued into a capture (it does not run).
    fn launch(&self, gpu: &SimGpu, stream: Stream, touch: Option<Touch>);
    fn stream_destroying(&self, gpu: &SimGpu, stream: Stream);
    fn begin_capture(&self, gpu: &SimGpu, stream: Stream, mode: CaptureMode) -> bool;
    fn end_capture(&self, gpu: &SimGpu, stream: Stream);
    fn reset(&self, gpu: &SimGpu);
    /// What the shim promises about frees whose work is not yet done, when
    /// the program holds `in_use` bytes of the pool of a GPU of `capacity`.
    fn pending_bound(&self, in_use: u64, capacity: u64) -> u64;
    /// Whether a freed block of `size` bytes counts toward that bound (the
    /// real allocator's large blocks stay cached outside it).
    fn bounded(&self, _size: u64) -> bool {
        true
    }
}

impl Shim for Allocator {
    fn malloc(&self, gpu: &SimGpu, size: u64) -> Option<u64> {
        if self.capture_in_progress() {
            return None;
        }
        self.alloc(gpu, gpu.context(), size, 0, Memory::Device).ok()
    }

    fn free(&self, gpu: &SimGpu, ptr: u64) {
        match Allocator::free(self, gpu, ptr, MemoryKind::Device) {
            Freed::Issued { .. } | Freed::Deferred => {}
            other => panic!("free of the live pool block {ptr:#x}: {other:?}"),
        }
    }

    fn free_async(&self, gpu: &SimGpu, ptr: u64, stream: Stream) {
        let freed = self.forget(Some(gpu), ptr, || gpu.free_async(ptr, stream).is_ok());
        assert!(matches!(freed, Freed::Issued { .. } | Freed::Deferred), "{freed:?}");
    }

    fn stream_created(&self, gpu: &SimGpu, stream: Stream) {
        Allocator::stream_created(self, gpu, stream, self.config.track_work);
    }

    fn launch(&self, gpu: &SimGpu, stream: Stream, touch: Option<Touch>) {
        let launch = || touch.map(|touch| gpu.launch(stream, touch));
        // As the front door: only where it sees every call that issues work.
        if self.config.track_work {
            self.issue_work(gpu, &[stream], NullStream::Legacy, launch);
        } else {
            launch();
        }
    }

    fn stream_destroying(&self, gpu: &SimGpu, stream: Stream) {
        Allocator::stream_destroying(self, gpu, stream);
    }

    fn begin_capture(&self, gpu: &SimGpu, stream: Stream, mode: CaptureMode) -> bool {
        let mut began = false;
        Allocator::begin_capture(self, Some(gpu), stream, || {
            began = gpu.begin_capture(stream, mode);
            began
        });
        began
    }

    fn end_capture(&self, gpu: &SimGpu, stream: Stream) {
        Allocator::end_capture(self, Some(gpu), stream, || gpu.end_capture(stream));
    }

    fn reset(&self, gpu: &SimGpu) {
        self.device_resetting(gpu, 0);
        gpu.reset();
    }

    fn pending_bound(&self, in_use: u64, capacity: u64) -> u64 {
        let limit = self.config.pending_free_limit.resolve(capacity);
        // Small blocks in the cache have a budget of their own, as large again.
        let small_budget = if self.config.small_blocks > 0 { limit } else { 0 };
        limit.max(in_use) + small_budget
    }

    fn bounded(&self, size: u64) -> bool {
        self.config.large_blocks == 0 || size < self.config.large_blocks
    }
}

/// Frees on the legacy stream alone, and reuses there at once: what a shim
/// that forgets non-blocking streams would do.
struct NaiveShim {
    pool: std::sync::OnceLock<Pool>,
}

impl Shim for NaiveShim {
    fn malloc(&self, gpu: &SimGpu, size: u64) -> Option<u64> {
        let pool = *self.pool.get_or_init(|| gpu.create_pool(0).expect("pool"));
        gpu.alloc_from_pool(size, pool, Stream::LEGACY).ok()
    }
    fn free(&self, gpu: &SimGpu, ptr: u64) {
        let _ = gpu.free_async(ptr, Stream::LEGACY); // fails in a global capture: leaked
    }
    fn free_async(&self, gpu: &SimGpu, ptr: u64, stream: Stream) {
        gpu.free_async(ptr, stream).expect("a live pool block");
    }
    fn stream_created(&self, _: &SimGpu, _: Stream) {}
    fn launch(&self, gpu: &SimGpu, stream: Stream, touch: Option<Touch>) {
        if let Some(touch) = touch {
            gpu.launch(stream, touch);
        }
    }
    fn stream_destroying(&self, _: &SimGpu, _: Stream) {}
    fn begin_capture(&self, gpu: &SimGpu, stream: Stream, mode: CaptureMode) -> bool {
        gpu.begin_capture(stream, mode)
    }
    fn end_capture(&self, gpu: &SimGpu, stream: Stream) {
        gpu.end_capture(stream)
    }
    fn reset(&self, gpu: &SimGpu) {
        gpu.reset();
    }
    fn pending_bound(&self, _: u64, _: u64) -> u64 {
        u64::MAX
    }
}

/// One step of a random program; indices pick among what exists.
#[derive(Clone, Debug)]
enum Action {
    Alloc { mib: u8 },
    Launch { block: u8, stream: u8 },
    Free { block: u8 },
    FreeAsync,
    CreateStream { nonblocking: bool },
    DestroyStream { stream: u8 },
    Progress { ops: u8 },
    HostSync,
    BeginCapture { stream: u8, mode: u8 },
    EndCapture,
    Reset,
}

fn action(scale: Scale) -> impl Strategy<Value = Action> {
    // (The small scale's strategy must stay as it is: the saved regression
    // seeds replay through it.)
    let mib = if scale.large_blocks {
        prop_oneof![1 => 1u8..=3, 1 => prop::sample::select(&[16u8, 40, 96][..])].boxed()
    } else {
        (1u8..=3).boxed()
    };
    prop_oneof![
        6 => mib.prop_map(|mib| Action::Alloc { mib }),
        8 => (any::<u8>(), any::<u8>()).prop_map(|(block, stream)| Action::Launch { block, stream }),
        5 => any::<u8>().prop_map(|block| Action::Free { block }),
        1 => Just(Action::FreeAsync),
        2 => any::<bool>().prop_map(|nonblocking| Action::CreateStream { nonblocking }),
        1 => any::<u8>().prop_map(|stream| Action::DestroyStream { stream }),
        6 => (1u8..=12).prop_map(|ops| Action::Progress { ops }),
        1 => Just(Action::HostSync),
        1 => (any::<u8>(), 0u8..3).prop_map(|(stream, mode)| Action::BeginCapture { stream, mode }),
        1 => Just(Action::EndCapture),
        1 => Just(Action::Reset),
    ]
}

struct LiveBlock {
    touch: Touch,
    size: u64,
    pooled: bool,
    /// Streams its work went to (a `cudaFreeAsync` is only legal on the one).
    used_on: HashSet<usize>,
}

/// The program's side of a run: its streams and blocks.
struct Program<'a, S: Shim> {
    gpu: &'a SimGpu,
    shim: &'a S,
    scale: Scale,
    streams: Vec<(Stream, bool)>,
    blocks: Vec<LiveBlock>,
    /// Blocks the shim took back with `cudaFree`, by address: size and allocation number.
    freed: HashMap<u64, (u64, u64)>,
    capture: Option<(Stream, CaptureMode)>,
    next_real_address: u64,
}

impl<'a, S: Shim> Program<'a, S> {
    fn new(gpu: &'a SimGpu, shim: &'a S, scale: Scale) -> Self {
        Program {
            gpu,
            shim,
            scale,
            streams: vec![(Stream::LEGACY, false), (PER_THREAD, false)],
            blocks: Vec::new(),
            freed: HashMap::new(),
            capture: None,
            next_real_address: 0x1_0000_0000,
        }
    }

    fn global_capture(&self) -> bool {
        matches!(self.capture, Some((_, CaptureMode::Global)))
    }

    fn capturing(&self, stream: Stream) -> bool {
        self.capture.is_some_and(|(s, _)| s == stream)
    }

    fn run(&mut self, action: &Action) -> Result<(), String> {
        match *action {
            Action::Alloc { mib } => {
                let size = u64::from(mib) * MIB;
                let (ptr, pooled) = match self.shim.malloc(self.gpu, size) {
                    Some(ptr) => (ptr, true),
                    None => {
                        // The real allocator: fresh addresses, never reused.
                        self.next_real_address += size;
                        (self.next_real_address, false)
                    }
                };
                let touch = Touch { ptr, generation: self.gpu.next_generation(ptr) };
                self.blocks.push(LiveBlock { touch, size, pooled, used_on: HashSet::new() });
                if pooled {
                    self.freed.remove(&ptr); // handed out again, so no longer pending
                    // The pool grows (a new address) only while pending frees are within the bound.
                    if touch.generation == 1 {
                        self.check_pending_bound()?;
                    }
                }
            }
            Action::Launch { block, stream } => {
                if self.blocks.is_empty() {
                    return Ok(());
                }
                let (stream, _) = self.streams[usize::from(stream) % self.streams.len()];
                // A legacy launch fails in a global capture; a captured one does not run.
                if stream == Stream::LEGACY && self.global_capture() {
                    return Ok(());
                }
                if self.capturing(stream) {
                    self.shim.launch(self.gpu, stream, None);
                    return Ok(());
                }
                let index = usize::from(block) % self.blocks.len();
                self.blocks[index].used_on.insert(stream.0 as usize);
                self.shim.launch(self.gpu, stream, Some(self.blocks[index].touch));
            }
            Action::Free { block } => {
                if self.blocks.is_empty() {
                    return Ok(());
                }
                let index = usize::from(block) % self.blocks.len();
                if !self.blocks[index].pooled {
                    if self.capture.is_some() {
                        return Ok(()); // the real cudaFree would fail or be queued
                    }
                    self.gpu.drain(); // the real cudaFree synchronizes the device
                    self.blocks.swap_remove(index);
                    return Ok(());
                }
                let block = self.blocks.swap_remove(index);
                self.gpu.program_freed(block.touch);
                self.freed.insert(block.touch.ptr, (block.size, block.touch.generation));
                self.shim.free(self.gpu, block.touch.ptr);
            }
            Action::FreeAsync => {
                // Legal only on the one live stream that used the block.
                let stream_of = |b: &LiveBlock| match b.used_on.iter().next() {
                    Some(&s) => Stream(s as *mut std::ffi::c_void),
                    None => Stream::LEGACY,
                };
                let usable = |b: &LiveBlock| {
                    let stream = stream_of(b);
                    b.pooled
                        && b.used_on.len() <= 1
                        && self.streams.iter().any(|&(s, _)| s == stream)
                        && !self.capturing(stream)
                        && !(stream == Stream::LEGACY && self.global_capture())
                };
                let Some(index) = self.blocks.iter().position(usable) else {
                    return Ok(());
                };
                let stream = stream_of(&self.blocks[index]);
                let block = self.blocks.swap_remove(index);
                self.gpu.program_freed_on(block.touch, stream);
                self.shim.free_async(self.gpu, block.touch.ptr, stream);
            }
            Action::CreateStream { nonblocking } => {
                if self.streams.len() >= self.scale.streams {
                    return Ok(());
                }
                let stream = self.gpu.program_stream(nonblocking);
                if nonblocking {
                    self.shim.stream_created(self.gpu, stream);
                }
                self.streams.push((stream, nonblocking));
            }
            Action::DestroyStream { stream } => {
                let index = usize::from(stream) % self.streams.len();
                let (stream, _) = self.streams[index];
                if index < 2 || self.capturing(stream) {
                    return Ok(());
                }
                self.shim.stream_destroying(self.gpu, stream);
                self.gpu.program_destroy_stream(stream);
                self.streams.remove(index);
            }
            Action::Progress { ops } => self.gpu.progress(usize::from(ops)),
            Action::HostSync => {
                if self.capture.is_none() {
                    self.gpu.drain();
                }
            }
            Action::BeginCapture { stream, mode } => {
                if self.capture.is_some() {
                    return Ok(());
                }
                let (stream, _) = self.streams[usize::from(stream) % self.streams.len()];
                if stream == Stream::LEGACY {
                    return Ok(());
                }
                let mode = [CaptureMode::Global, CaptureMode::ThreadLocal, CaptureMode::Relaxed][usize::from(mode)];
                if self.shim.begin_capture(self.gpu, stream, mode) {
                    self.capture = Some((stream, mode));
                }
            }
            Action::EndCapture => {
                if let Some((stream, _)) = self.capture.take() {
                    self.shim.end_capture(self.gpu, stream);
                }
            }
            Action::Reset => {
                if self.capture.is_some() {
                    return Ok(());
                }
                self.shim.reset(self.gpu);
                self.blocks.clear();
                self.freed.clear();
                self.streams.truncate(2);
            }
        }
        Ok(())
    }

    /// Bytes the program freed, still held by the shim, whose earlier work
    /// has not finished (so not reusable yet).
    fn check_pending_bound(&mut self) -> Result<(), String> {
        let gpu = self.gpu;
        self.freed.retain(|&ptr, _| gpu.is_allocated(ptr));
        let pending: u64 = self
            .freed
            .iter()
            .filter(|&(&ptr, &(size, generation))| {
                self.shim.bounded(size) && gpu.work_before_free_unfinished(Touch { ptr, generation })
            })
            .map(|(_, &(size, _))| size)
            .sum();
        // What the program held when it asked (the new block is the last).
        let in_use: u64 = self.blocks.iter().rev().skip(1).filter(|b| b.pooled).map(|b| b.size).sum();
        let bound = self.shim.pending_bound(in_use, self.scale.capacity);
        if pending > bound {
            return Err(format!("{pending} bytes of frees pending after an allocation, over the bound of {bound}"));
        }
        Ok(())
    }

    fn finish(&mut self) {
        if let Some((stream, _)) = self.capture.take() {
            self.shim.end_capture(self.gpu, stream);
        }
        self.gpu.drain();
    }
}

/// Runs `actions` against `shim` on a GPU whose order is drawn from `seed`;
/// the violations found, as text.
fn violations_of(shim: &impl Shim, actions: &[Action], seed: u64) -> Vec<String> {
    run_on(&SimGpu::new(seed, CAPACITY), shim, SMALL, actions)
}

/// Runs `actions` against `shim` on `gpu`, a GPU of `scale`; the violations
/// found, as text.
fn run_on(gpu: &SimGpu, shim: &impl Shim, scale: Scale, actions: &[Action]) -> Vec<String> {
    run_with_steps(gpu, shim, scale, actions, |_| {})
}

/// As `run_on`, with `before(i)` run before the `i`th action (the shim's own
/// thread stepping where the test says).
fn run_with_steps(gpu: &SimGpu, shim: &impl Shim, scale: Scale, actions: &[Action], before: impl Fn(usize)) -> Vec<String> {
    let mut program = Program::new(gpu, shim, scale);
    let mut found = Vec::new();
    for (i, action) in actions.iter().enumerate() {
        before(i);
        if let Err(e) = program.run(action) {
            found.push(format!("{action:?}: {e}"));
        }
    }
    program.finish();
    let v = gpu.violations();
    found.extend(v.early_reuse.into_iter().chain(v.capture).chain(v.misuse));
    found
}

fn allocator(settings: &[(&str, &str)]) -> Allocator {
    let vars = settings.iter().map(|(name, value)| (name.into(), value.into()));
    Allocator::new(Config::from_environment(vars).expect("valid settings"), |_| None)
}

fn program() -> impl Strategy<Value = (Vec<Action>, u64)> {
    program_of(SMALL)
}

fn program_of(scale: Scale) -> impl Strategy<Value = (Vec<Action>, u64)> {
    (prop::collection::vec(action(scale), 1..150), any::<u64>())
}

/// A program, and where the shim's own thread steps: before action `i` if
/// `steps[i % steps.len()]` is 0 (a quarter of the places).
fn program_with_steps() -> impl Strategy<Value = ((Vec<Action>, u64), Vec<u8>)> {
    (program(), prop::collection::vec(0u8..4, 1..64))
}

/// Runs `actions` with the reclaimer counted as running, so that no
/// allocation orders frees itself below the pending bound, and its steps
/// taken only at `steps`' places: allocations between a free and the step
/// that orders it, as a lagging thread leaves them.
fn violations_with_lagging_reclaimer(settings: &[(&str, &str)], actions: &[Action], seed: u64, steps: &[u8]) -> Vec<String> {
    let gpu = SimGpu::new(seed, CAPACITY);
    let shim = allocator(settings);
    shim.reclaimer.pretend_running();
    run_with_steps(&gpu, &shim, SMALL, actions, |i| {
        if steps[i % steps.len()] == 0 {
            shim.reclaim_all(&gpu);
        }
    })
}

/// The settings the large programs run under: each reaches the default
/// pending limit's barriers by its own path.
const LARGE_SETTINGS: [&[(&str, &str)]; 5] = [
    &[],
    &[("SOMA_TRACK_WORK", "0")],
    &[("SOMA_LEGACY_CACHE", "on")],
    &[("SOMA_SMALL_BLOCKS", "0")],
    &[("SOMA_LARGE_BLOCKS", "16MiB")],
];

/// The settings under which blocks of the real allocator (`SOMA_LARGE_BLOCKS`)
/// are common in the small programs: in every order of frees.
const LARGE_BLOCK_SETTINGS: [&[(&str, &str)]; 4] = [
    &[("SOMA_LARGE_BLOCKS", "2MiB")],
    &[("SOMA_LARGE_BLOCKS", "2MiB"), ("SOMA_FREE_ORDER", "barrier")],
    &[("SOMA_LARGE_BLOCKS", "1MiB"), ("SOMA_PENDING_FREE_LIMIT", "0")],
    &[("SOMA_LARGE_BLOCKS", "2MiB"), ("SOMA_LEGACY_CACHE", "on")],
];

/// The settings the lagging reclaimer's programs run under.
const LAGGING_SETTINGS: [&[(&str, &str)]; 4] = [
    &[],
    &[("SOMA_FREE_ORDER", "barrier")],
    &[("SOMA_PENDING_FREE_LIMIT", "0")],
    &[("SOMA_LARGE_BLOCKS", "2MiB")],
];

proptest! {
    #![proptest_config(search())]

    #[test]
    fn no_block_is_reused_before_earlier_work_default((actions, seed) in program()) {
        let found = violations_of(&allocator(&[]), &actions, seed);
        prop_assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_barrier((actions, seed) in program()) {
        let found = violations_of(&allocator(&[("SOMA_FREE_ORDER", "barrier")]), &actions, seed);
        prop_assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_small_pending_limit((actions, seed) in program()) {
        let found = violations_of(&allocator(&[("SOMA_PENDING_FREE_LIMIT", "2MiB")]), &actions, seed);
        prop_assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_past_the_limit((actions, seed) in program()) {
        // Every batch is ordered behind a barrier and its blocks reused at once.
        let found = violations_of(&allocator(&[("SOMA_PENDING_FREE_LIMIT", "0")]), &actions, seed);
        prop_assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_untracked((actions, seed) in program()) {
        // Every live non-blocking stream asked at every batch, and waiting at every barrier.
        for limit in ["64MiB", "0"] {
            let settings = [("SOMA_TRACK_WORK", "0"), ("SOMA_PENDING_FREE_LIMIT", limit)];
            let found = violations_of(&allocator(&settings), &actions, seed);
            prop_assert!(found.is_empty(), "{limit}: {found:#?}");
        }
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_legacy_cache((actions, seed) in program()) {
        // With only blocking streams, every free keeps its block in the cache.
        let found = violations_of(&allocator(&[("SOMA_LEGACY_CACHE", "on")]), &actions, seed);
        prop_assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_large_blocks((actions, seed) in program()) {
        for settings in LARGE_BLOCK_SETTINGS {
            let found = violations_of(&allocator(settings), &actions, seed);
            prop_assert!(found.is_empty(), "{settings:?}: {found:#?}");
        }
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_default_pool((actions, seed) in program()) {
        let found = violations_of(&allocator(&[("SOMA_POOL", "default")]), &actions, seed);
        prop_assert!(found.is_empty(), "{found:#?}");
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_lagging_reclaimer(((actions, seed), steps) in program_with_steps()) {
        for settings in LAGGING_SETTINGS {
            let found = violations_with_lagging_reclaimer(settings, &actions, seed, &steps);
            prop_assert!(found.is_empty(), "{settings:?}: {found:#?}");
        }
    }

    #[test]
    fn no_block_is_reused_before_earlier_work_past_the_default_limit((actions, seed) in program_of(LARGE)) {
        for settings in LARGE_SETTINGS {
            let found = run_on(&SimGpu::new(seed, LARGE.capacity), &allocator(settings), LARGE, &actions);
            prop_assert!(found.is_empty(), "{settings:?}: {found:#?}");
        }
    }
}

/// The large programs do reach the default limit's path: the property
/// above is not searching only where the limit is never passed.
#[test]
fn large_programs_pass_the_default_pending_limit() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let runs = 100;
    let mut reached = 0;
    for _ in 0..runs {
        let (actions, seed) = program_of(LARGE).new_tree(&mut runner).expect("a program").current();
        let shim = allocator(&[]);
        let _ = run_on(&SimGpu::new(seed, LARGE.capacity), &shim, LARGE, &actions);
        if shim.stats.counters(0, false).limit_barriers.load(Ordering::Relaxed) > 0 {
            reached += 1;
        }
    }
    eprintln!("{reached} of {runs} large programs ordered frees behind the default limit's barriers");
    assert!(reached > runs / 10, "only {reached} of {runs} large programs passed the default pending limit");
}

/// The same program on the same seed runs the same way every time: the same
/// addresses handed out in the same order, the same ops, the same verdict.
/// (A replayed failure fails every time, and shrinking converges.)
#[test]
fn a_program_and_seed_replay_exactly() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    for (scale, settings) in [(SMALL, &[][..]), (SMALL, &[("SOMA_FREE_ORDER", "barrier")][..]), (LARGE, &[][..])] {
        for _ in 0..40 {
            let (actions, seed) = program_of(scale).new_tree(&mut runner).expect("a program").current();
            let run = || {
                let gpu = SimGpu::new(seed, scale.capacity);
                let found = run_on(&gpu, &allocator(settings), scale, &actions);
                (gpu.history(), found)
            };
            assert_eq!(run(), run(), "{settings:?}: two runs of seed {seed} differ: {actions:?}");
        }
    }
}

/// The teeth: the same programs find the naive shim out.
#[test]
fn a_shim_that_frees_on_the_legacy_stream_alone_is_caught() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let mut caught = 0;
    let runs = 200;
    for _ in 0..runs {
        let (actions, seed) = program().new_tree(&mut runner).expect("a program").current();
        let naive = NaiveShim { pool: std::sync::OnceLock::new() };
        if !violations_of(&naive, &actions, seed).is_empty() {
            caught += 1;
        }
    }
    eprintln!("the checks caught the naive shim in {caught} of {runs} random programs");
    assert!(caught > runs / 10, "the checks caught the naive shim in only {caught} of {runs} programs");
}

/// A fixed program that needs no luck: a kernel on a non-blocking stream
/// still runs when the block is freed and allocated again.
#[test]
fn the_naive_shim_fails_the_basic_race_and_ours_passes() {
    let actions = [
        Action::CreateStream { nonblocking: true },
        Action::Alloc { mib: 1 },
        Action::Launch { block: 0, stream: 2 },
        Action::Free { block: 0 },
        Action::Alloc { mib: 1 },
        Action::Launch { block: 0, stream: 0 },
    ];
    // The race shows when the GPU runs the new owner's kernel first: some orders do.
    let caught = (0..32).filter(|&seed| {
        let naive = violations_of(&NaiveShim { pool: std::sync::OnceLock::new() }, &actions, seed);
        naive.iter().any(|v| v.contains("ran before"))
    });
    assert!(caught.count() > 0, "no order of the GPU showed the naive shim's race");
    for seed in 0..32 {
        for settings in [&[][..], &[("SOMA_FREE_ORDER", "barrier")][..]] {
            let ours = violations_of(&allocator(settings), &actions, seed);
            assert!(ours.is_empty(), "{settings:?}, seed {seed}: {ours:#?}");
        }
    }
}

/// A thread that makes the simulated GPU progress until stopped, as a GPU
/// runs beside the host.
struct GpuRunning {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl GpuRunning {
    fn start(gpu: &'static SimGpu) -> GpuRunning {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    gpu.progress(3);
                    std::thread::yield_now();
                }
            })
        };
        GpuRunning { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the GPU thread");
    }
}

/// Many host threads, each with a stream of its own (non-blocking for three
/// in four, or blocking for all), allocate and free at once while the GPU
/// runs in the background, and the reclaimer thread joins and returns their
/// frees, or ages the blocks kept in the legacy stream's order.
#[test]
fn threads_freeing_at_once_lose_nothing_and_reuse_nothing_early() {
    let rounds = [
        (1, &[][..], true),
        (2, &[("SOMA_FREE_ORDER", "barrier")][..], true),
        (3, &[][..], true),
        (4, &[("SOMA_LEGACY_CACHE", "on")][..], false),
        (5, &[][..], false),
        (6, &[("SOMA_LEGACY_CACHE", "off")][..], false),
    ];
    for (seed, settings, nonblocking) in rounds {
        // The reclaimer thread borrows both for the life of the process.
        let gpu: &'static SimGpu = Box::leak(Box::new(SimGpu::new(seed, 1 << 30)));
        let shim: &'static Allocator = Box::leak(Box::new(allocator(settings)));
        assert!(shim.start_reclaimer(gpu));
        let background = GpuRunning::start(gpu);
        let threads: Vec<_> = (0..8)
            .map(|t| {
                std::thread::spawn(move || -> u64 {
                    let own_nonblocking = nonblocking && t % 4 != 0;
                    let own = gpu.program_stream(own_nonblocking);
                    if own_nonblocking {
                        Shim::stream_created(shim, gpu, own);
                    }
                    let mut pooled = 0;
                    for i in 0..150u64 {
                        let size = (1 + (i + t) % 3) * MIB;
                        let Some(ptr) = Shim::malloc(shim, gpu, size) else {
                            continue; // the real allocator served it: nothing to check
                        };
                        pooled += 1;
                        let touch = Touch { ptr, generation: gpu.next_generation(ptr) };
                        let stream = if i % 3 == 0 { Stream::LEGACY } else { own };
                        shim.launch(gpu, stream, Some(touch));
                        gpu.program_freed(touch);
                        Shim::free(shim, gpu, ptr);
                    }
                    pooled
                })
            })
            .collect();
        let pooled: u64 = threads.into_iter().map(|t| t.join().expect("a program thread")).sum();
        shim.reclaimer.stop();
        background.stop();
        gpu.drain();
        assert!(pooled > 8 * 150 / 2, "{settings:?}: the pool served only {pooled} of 1200 allocations");
        let kept = shim.stats.device(0).total(|t| &t.legacy_cached_frees);
        match settings {
            [("SOMA_LEGACY_CACHE", "on")] => assert!(kept > 0, "only blocking streams: no free was kept"),
            [("SOMA_LEGACY_CACHE", "off")] => assert_eq!(kept, 0, "{kept} frees kept"),
            _ => {} // auto: whether threads on two cores take turns is up to the scheduler
        }
        let v = gpu.violations();
        assert!(v.is_empty(), "{settings:?}: {v:#?}");
    }
}

/// A block ordered behind a barrier is handed out while its old work may
/// still run: a non-blocking stream made after the barrier must still be
/// ordered after that work, even when the host last waited for the legacy
/// stream (another stream's creation) before the barrier was issued.
#[test]
fn a_stream_made_after_a_barrier_waits_for_the_work_before_its_frees() {
    for seed in 0..16 {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_FREE_ORDER", "barrier")]);
        let first = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, first);
        let ptr = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        let old = Touch { ptr, generation: gpu.next_generation(ptr) };
        shim.launch(&gpu, first, Some(old)); // runs only when the GPU is drained
        gpu.program_freed(old);
        Shim::free(&shim, &gpu, ptr);
        // The host waits for the legacy stream here, before any barrier.
        Shim::stream_created(&shim, &gpu, gpu.program_stream(true));
        // An allocation of another size orders the queued free behind a barrier.
        let other = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        let late = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, late);
        let again = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        assert_eq!(again, ptr, "seed {seed}: the barrier's block comes back from the cache");
        shim.launch(&gpu, late, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
        gpu.drain();
        assert!(gpu.violations().is_empty(), "seed {seed}: {:?}", gpu.violations());
        for p in [other, again] {
            Shim::free(&shim, &gpu, p);
        }
    }
}

/// The old owner's work on `stream` (behind eight other ops, so that it runs
/// late), then its `cudaFreeAsync` of `ptr` there.
fn program_frees_late(shim: &Allocator, gpu: &SimGpu, ptr: u64, stream: Stream) -> Touch {
    let old = program_works_late(shim, gpu, ptr, stream);
    gpu.program_freed_on(old, stream);
    Shim::free_async(shim, gpu, ptr, stream);
    old
}

/// The owner's work with `ptr` on `stream`, behind eight other ops.
fn program_works_late(shim: &Allocator, gpu: &SimGpu, ptr: u64, stream: Stream) -> Touch {
    let work = Touch { ptr, generation: gpu.next_generation(ptr) };
    for _ in 0..8 {
        shim.launch(gpu, stream, Some(Touch { ptr: 0xdead, generation: 1 }));
    }
    shim.launch(gpu, stream, Some(work));
    work
}

/// `ptr`, handed out again, used on `stream`: whether the GPU, run to the
/// end, ran that before the old owner's work.
fn reused_early(shim: &impl Shim, gpu: &SimGpu, ptr: u64, stream: Stream) -> bool {
    shim.launch(gpu, stream, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
    gpu.drain();
    !gpu.violations().early_reuse.is_empty()
}

/// The program frees a block itself on the legacy stream while its old work
/// there runs, then makes a non-blocking stream; a `cudaFree` in barrier order
/// moves allocations to the legacy stream before the reclaimer's next step,
/// and the pool hands the block out there. The new stream must not run the
/// new owner's work beside the old: it was made after the free, so it waited
/// for the legacy stream's work first. With and without a capture around the
/// free (then its ordering was owed until the capture ended).
#[test]
fn a_stream_made_after_a_program_free_waits_for_the_work_before_it() {
    for (seed, capture) in (0..16).flat_map(|seed| [(seed, false), (seed, true)]) {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_FREE_ORDER", "barrier")]);
        shim.reclaimer.pretend_running();
        let first = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, first);
        let (p, q) = (Shim::malloc(&shim, &gpu, MIB).expect("pooled"), Shim::malloc(&shim, &gpu, MIB).expect("pooled"));
        if capture {
            assert!(Shim::begin_capture(&shim, &gpu, first, CaptureMode::Relaxed));
        }
        program_frees_late(&shim, &gpu, p, Stream::LEGACY);
        if capture {
            Shim::end_capture(&shim, &gpu, first);
        }
        let made_after = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, made_after);
        let early = cudafree_hands_out_again_early(&shim, &gpu, p, q, made_after, seed);
        assert!(!early, "seed {seed}, capture {capture}: {:?}", gpu.violations());
    }
}

/// Frees `q` with `cudaFree` in barrier order, so that allocations move to
/// the legacy stream, where the pool hands out `p` (which the program freed
/// itself) to the next allocation; whether that block's new work then runs
/// early on `stream`.
fn cudafree_hands_out_again_early(shim: &Allocator, gpu: &SimGpu, p: u64, q: u64, stream: Stream, seed: u64) -> bool {
    gpu.program_freed(Touch { ptr: q, generation: gpu.next_generation(q) });
    Shim::free(shim, gpu, q);
    let again = Shim::malloc(shim, gpu, MIB).expect("pooled");
    assert_eq!(again, p, "seed {seed}: the pool hands the block out again on the legacy stream");
    reused_early(shim, gpu, p, stream)
}

/// As above, with no non-blocking stream at the free (so nothing waited
/// then) and the new stream made during a global capture begun after it: it
/// waits on the GPU for the mark recorded as the capture began, which must
/// cover the work before the program's free.
#[test]
fn a_stream_made_during_a_capture_after_a_program_free_waits_for_the_work_before_it() {
    for seed in 0..16 {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_FREE_ORDER", "barrier")]);
        shim.reclaimer.pretend_running();
        let (p, q) = (Shim::malloc(&shim, &gpu, MIB).expect("pooled"), Shim::malloc(&shim, &gpu, MIB).expect("pooled"));
        program_frees_late(&shim, &gpu, p, Stream::LEGACY);
        assert!(Shim::begin_capture(&shim, &gpu, PER_THREAD, CaptureMode::Global));
        let made_during = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, made_during);
        Shim::end_capture(&shim, &gpu, PER_THREAD);
        let early = cudafree_hands_out_again_early(&shim, &gpu, p, q, made_during, seed);
        assert!(!early, "seed {seed}: {:?}", gpu.violations());
    }
}

/// The allocator is built on whichever program thread calls first, whatever
/// its stack: its per-thread-shard tables live on the heap.
#[test]
fn the_allocator_is_built_on_a_small_stack() {
    assert!(std::mem::size_of::<Allocator>() < 32 << 10, "{} bytes", std::mem::size_of::<Allocator>());
    let built = std::thread::Builder::new()
        .stack_size(128 << 10)
        .spawn(|| {
            let cell = std::sync::OnceLock::new();
            cell.get_or_init(|| allocator(&[])).stats.device(0).total(|t| &t.pool_allocs)
        })
        .expect("a thread")
        .join();
    assert_eq!(built.expect("built without overflowing the stack"), 0);
}

/// A block the program frees itself on a non-blocking stream X, once the
/// program makes the legacy stream wait for X, must not reach a `cudaMalloc`
/// on the legacy stream (where allocations go after a barrier) through the
/// pool's event dependencies: a non-blocking stream Y using it is not
/// ordered after the old work on X. (Found by review.)
#[test]
fn a_program_free_joined_into_the_legacy_stream_is_not_reused_there_early() {
    for seed in 0..32 {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_PENDING_FREE_LIMIT", "0")]);
        let (x, y) = (gpu.program_stream(true), gpu.program_stream(true));
        Shim::stream_created(&shim, &gpu, x);
        Shim::stream_created(&shim, &gpu, y);
        let p = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        let q = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        Shim::free(&shim, &gpu, q);
        let _ordered = Shim::malloc(&shim, &gpu, 3 * MIB).expect("pooled"); // orders q behind a barrier
        program_frees_late(&shim, &gpu, p, x);
        let joined = gpu.create_event().expect("an event");
        gpu.record(joined, x).expect("recorded");
        gpu.wait_event(Stream::LEGACY, joined).expect("waited");
        let again = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        assert!(again != p || !reused_early(&shim, &gpu, p, y), "seed {seed}: {:?}", gpu.violations());
    }
}

/// A `cudaFreeAsync` on the legacy stream by another thread while a barrier
/// is being issued: the block may be reused there at once, so every
/// non-blocking stream must wait for the work before it first. (Found by
/// review.) Both shapes of barrier: through the join stream (a non-blocking
/// stream is busy; the free lands once the legacy stream waits) and on the
/// legacy stream itself (all idle; the free lands between the streams' waits,
/// which only untracked streams have: tracked ones wait at their next work).
#[test]
fn a_program_free_during_a_barrier_is_ordered() {
    let shapes = [(true, "1"), (true, "0"), (false, "0")];
    for (seed, (busy, track)) in (0..16).flat_map(|seed| shapes.map(|shape| (seed, shape))) {
        let gpu: &'static SimGpu = Box::leak(Box::new(SimGpu::new(seed, CAPACITY)));
        let settings = [("SOMA_PENDING_FREE_LIMIT", "0"), ("SOMA_TRACK_WORK", track)];
        let shim: &'static Allocator = Box::leak(Box::new(allocator(&settings)));
        let (x, y) = (gpu.program_stream(true), gpu.program_stream(true));
        Shim::stream_created(shim, gpu, x);
        Shim::stream_created(shim, gpu, y);
        let p = Shim::malloc(shim, gpu, 2 * MIB).expect("pooled");
        let q = Shim::malloc(shim, gpu, MIB).expect("pooled");
        if busy {
            shim.launch(gpu, x, Some(Touch { ptr: 0xdead, generation: 1 }));
        }
        Shim::free(shim, gpu, q);
        let landed = std::sync::Arc::new(AtomicBool::new(false));
        let landed_in_hook = landed.clone();
        let mid_barrier = if busy { Stream::LEGACY } else { x };
        *gpu.after_next_wait.lock().expect("the hook") = Some((
            mid_barrier,
            Box::new(move || {
                program_frees_late(shim, gpu, p, Stream::LEGACY);
                landed_in_hook.store(true, Ordering::SeqCst);
            }),
        ));
        let _ordered = Shim::malloc(shim, gpu, 3 * MIB).expect("pooled"); // orders q behind a barrier
        assert!(
            landed.load(Ordering::SeqCst),
            "seed {seed}, busy {busy}, track {track}: the free did not land mid-barrier"
        );
        let again = Shim::malloc(shim, gpu, 2 * MIB).expect("pooled");
        assert!(again != p || !reused_early(shim, gpu, p, y), "seed {seed}: {:?}", gpu.violations());
    }
}

/// With every non-blocking stream idle, a barrier is one event recorded on
/// the legacy stream and a wait for it on each non-blocking stream: the
/// legacy stream waits for nothing (no round trip through the join stream on
/// the GPU). A busy stream brings the join stream back. With their work
/// tracked, the streams are not asked (none has work not seen finished but
/// the busy one), and each waits only just before its next work.
#[test]
fn a_barrier_over_idle_streams_is_one_record_on_the_legacy_stream() {
    for (busy, track) in [(false, "0"), (true, "0"), (false, "1"), (true, "1")] {
        let gpu = SimGpu::new(3, CAPACITY);
        let shim = allocator(&[("SOMA_FREE_ORDER", "barrier"), ("SOMA_TRACK_WORK", track)]);
        let streams: Vec<Stream> = (0..8).map(|_| gpu.program_stream(true)).collect();
        for &stream in &streams {
            Shim::stream_created(&shim, &gpu, stream);
        }
        let ptr = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        shim.launch(&gpu, Stream::LEGACY, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
        if busy {
            shim.launch(&gpu, streams[0], Some(Touch { ptr: 0xdead, generation: 1 }));
        }
        Shim::free(&shim, &gpu, ptr);
        let before = (gpu.calls("record"), gpu.calls("wait_event"), gpu.calls("is_idle"));
        let again = Shim::malloc(&shim, &gpu, MIB).expect("pooled"); // orders the free behind a barrier
        let made =
            (gpu.calls("record") - before.0, gpu.calls("wait_event") - before.1, gpu.calls("is_idle") - before.2);
        // The legacy and the busy stream's records, done; the join stream's
        // waits, the streams' (untracked), the legacy stream's.
        let expected = match (busy, track) {
            (false, "0") => (1, 8, 8),
            (true, "0") => (3, 2 + 8 + 1, 8),
            (false, _) => (1, 0, 0),
            (true, _) => (3, 2 + 1, 1),
        };
        assert_eq!(made, expected, "busy {busy}, track {track}: (records, waits, streams asked) of one barrier");
        assert_eq!(again, ptr, "busy {busy}, track {track}: reused at once");
        let waits = gpu.calls("wait_event");
        assert!(!reused_early(&shim, &gpu, ptr, streams[1]), "busy {busy}, track {track}: {:?}", gpu.violations());
        let owed = if track == "1" { 1 } else { 0 };
        assert_eq!(gpu.calls("wait_event") - waits, owed, "track {track}: the stream's wait at its next work");
    }
}

/// Barrier order: a `cudaFreeAsync` on the legacy stream while allocations
/// are on the pool stream (a stream was just made), then a `cudaFree` that
/// moves them to the legacy stream before the shim's thread has ordered
/// anything: the block may be reused there, and a non-blocking stream must
/// already wait for its old work. (Found by review; older than the barrier cache.)
#[test]
fn a_program_free_before_barrier_order_moves_to_the_legacy_stream_is_ordered() {
    for seed in 0..16 {
        let gpu: &'static SimGpu = Box::leak(Box::new(SimGpu::new(seed, CAPACITY)));
        let shim: &'static Allocator = Box::leak(Box::new(allocator(&[("SOMA_FREE_ORDER", "barrier")])));
        // The shim's thread runs but does not reach its next step: no allocation reclaims.
        let (started, step) = (std::sync::Arc::new(std::sync::Barrier::new(2)), std::sync::Arc::new(AtomicBool::new(false)));
        let (s, st) = (started.clone(), step.clone());
        assert!(shim.reclaimer.start(std::time::Duration::MAX, move || {
            if !st.swap(true, Ordering::SeqCst) {
                s.wait();
            }
            std::thread::park();
            super::reclaimer::Activity::Idle
        }));
        started.wait();
        let y = gpu.program_stream(true);
        Shim::stream_created(shim, gpu, y);
        let p = Shim::malloc(shim, gpu, 2 * MIB).expect("pooled");
        program_frees_late(shim, gpu, p, Stream::LEGACY);
        let q = Shim::malloc(shim, gpu, MIB).expect("pooled");
        Shim::free(shim, gpu, q); // barrier order: allocations move to the legacy stream
        let again = Shim::malloc(shim, gpu, 2 * MIB).expect("pooled");
        assert!(again != p || !reused_early(shim, gpu, p, y), "seed {seed}: {:?}", gpu.violations());
    }
}

/// With non-blocking streams, a free costs the program's thread no driver
/// call that reaches a stream, an event or the pool (only the current
/// context is asked for), however many streams there are; a block whose
/// work has passed is handed out again the same way.
#[test]
fn frees_cost_no_driver_call_and_passed_blocks_come_back_without_one() {
    let mut calls_per_free = Vec::new();
    for streams in [1, 8, 256] {
        let gpu = SimGpu::new(5, CAPACITY);
        let shim = allocator(&[]);
        for _ in 0..streams {
            let stream = gpu.program_stream(true);
            Shim::stream_created(&shim, &gpu, stream);
        }
        let ptr = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        shim.launch(&gpu, Stream::LEGACY, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
        let before = gpu.work_calls();
        Shim::free(&shim, &gpu, ptr);
        calls_per_free.push(gpu.work_calls() - before);

        gpu.drain();
        // Any allocation reclaims when no thread does: the block is joined, and passes once the GPU runs.
        let other = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        gpu.drain();
        let other2 = Shim::malloc(&shim, &gpu, 3 * MIB).expect("pooled");
        let before = (gpu.work_calls(), shim.stats.device(0).total(|t| &t.cache_hits));
        let again = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        assert_eq!(again, ptr, "{streams} streams: the passed block of that size is reused");
        assert_eq!(gpu.work_calls(), before.0, "{streams} streams: a passed block came back with a driver call");
        assert_eq!(shim.stats.device(0).total(|t| &t.cache_hits), before.1 + 1);
        for p in [other, other2, again] {
            Shim::free(&shim, &gpu, p);
        }
        gpu.drain();
        assert!(gpu.violations().is_empty(), "{:?}", gpu.violations());
    }
    assert_eq!(calls_per_free, [0, 0, 0], "driver calls in a free with 1, 8 and 256 streams");
}

/// Blocks of at most `SOMA_SMALL_BLOCKS` bytes come from a pool of their
/// own, and in the cache they have a budget of their own: past the
/// pending-free limit, small blocks freed before a large one are still
/// there for the next allocations of their size, with no driver call.
#[test]
fn small_blocks_have_a_pool_and_a_cache_budget_of_their_own() {
    for small_blocks in ["1MiB", "0"] {
        let gpu = SimGpu::new(7, CAPACITY);
        let shim = allocator(&[("SOMA_SMALL_BLOCKS", small_blocks), ("SOMA_PENDING_FREE_LIMIT", "2MiB")]);
        let stream = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, stream);
        let small: Vec<u64> = (0..2).map(|_| Shim::malloc(&shim, &gpu, MIB).expect("pooled")).collect();
        let large = Shim::malloc(&shim, &gpu, 4 * MIB).expect("pooled");
        let own_pool = small_blocks != "0";
        assert_eq!(gpu.pool_of(small[0]) != gpu.pool_of(large), own_pool, "{small_blocks}: pools");
        for &ptr in small.iter().chain([&large]) {
            shim.launch(&gpu, stream, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
            Shim::free(&shim, &gpu, ptr);
        }
        gpu.drain();
        // Reclaims (the frees are ordered, then cached, and what is over a budget goes back to the pool).
        let other = Shim::malloc(&shim, &gpu, 3 * MIB).expect("pooled");
        gpu.drain();
        let other2 = Shim::malloc(&shim, &gpu, 5 * MIB).expect("pooled");
        let before = (gpu.work_calls(), shim.stats.device(0).total(|t| &t.cache_hits));
        let again: Vec<u64> = (0..2).map(|_| Shim::malloc(&shim, &gpu, MIB).expect("pooled")).collect();
        let from_cache = shim.stats.device(0).total(|t| &t.cache_hits) - before.1;
        if own_pool {
            assert_eq!((from_cache, gpu.work_calls()), (2, before.0), "small blocks: both from the cache, no driver call");
        } else {
            assert_eq!(from_cache, 0, "one budget: the oldest, the small blocks, went back to the pool first");
        }
        for ptr in again.into_iter().chain([other, other2]) {
            assert!(!reused_early(&shim, &gpu, ptr, stream), "{small_blocks}: {:?}", gpu.violations());
            Shim::free(&shim, &gpu, ptr);
        }
    }
}

/// Past the pending limit the program's thread never waits on the host for
/// device memory: the queued frees are freed behind a barrier on the legacy
/// stream and reused there at once, so the pool stays within the limit of
/// what the program holds though the GPU runs nothing. Pinned host memory,
/// which the CPU uses at once, waits for the oldest frees instead.
#[test]
fn past_the_pending_limit_device_frees_are_reused_at_once_and_host_frees_waited_for() {
    for memory in [Memory::Device, Memory::Host { flags: 0 }] {
        let gpu = SimGpu::new(9, CAPACITY);
        let shim = allocator(&[("SOMA_PENDING_FREE_LIMIT", "4MiB")]);
        let stream = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, stream);
        for i in 0..20 {
            let ptr = shim.alloc(&gpu, gpu.context(), MIB, 0, memory).expect("pooled");
            let touch = Touch { ptr, generation: gpu.next_generation(ptr) };
            shim.launch(&gpu, stream, Some(touch)); // never run until a wait forces it
            gpu.program_freed(touch);
            let kind = if memory.is_host() { MemoryKind::Host } else { MemoryKind::Device };
            assert!(matches!(shim.free(&gpu, ptr, kind), Freed::Issued { .. }));
            let waits = shim.stats.counters(0, memory.is_host()).pending_waits.load(Ordering::Relaxed);
            if memory.is_host() && i <= 4 {
                assert_eq!(waits, 0, "a wait for pinned frees with {i} MiB freed, limit 4 MiB");
            }
            if !memory.is_host() {
                // (An allocation of pinned memory waits for its pool stream, by design.)
                assert_eq!(gpu.host_waits(), 0, "a host wait with {i} MiB freed, limit 4 MiB");
            }
        }
        let counters = shim.stats.counters(0, memory.is_host());
        let (waits, barriers) = (counters.pending_waits.load(Ordering::Relaxed), counters.limit_barriers.load(Ordering::Relaxed));
        if memory.is_host() {
            // A wait covers every free joined with the one over the limit.
            assert!((1..=4).contains(&waits), "{waits} waits for 20 frees of 1 MiB over a 4 MiB limit");
            assert_eq!(barriers, 0, "host memory is never reused in a stream's order");
        } else {
            assert_eq!(waits, 0);
            assert!(barriers >= 10, "{barriers} batches behind barriers for 15 frees past the limit");
            assert_eq!(counters.batch_streams_high.load(Ordering::Relaxed), 1, "each batch waited for the one non-blocking stream");
            assert!(counters.batch_nanos.load(Ordering::Relaxed) > 0, "the batches' host time is counted");
            let held = gpu.reserved_high();
            assert!(held <= 6 * MIB, "the pool held {held} bytes: the limit, the block over it and the live one at most");
        }
        gpu.drain();
        assert!(gpu.violations().is_empty(), "{memory:?}: {:?}", gpu.violations());
    }
}

/// With only blocking streams and `SOMA_LEGACY_CACHE=on`, a free marks the
/// legacy stream (one driver call) and keeps the block; the next allocation
/// of its size takes it with no driver call, and the new owner's work on
/// another blocking stream still runs after the old owner's, whichever order
/// the GPU picks.
#[test]
fn a_block_kept_in_the_legacy_streams_order_comes_back_without_a_driver_call_and_in_order() {
    for seed in 0..32 {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_LEGACY_CACHE", "on")]);
        let (first, second) = (gpu.program_stream(false), gpu.program_stream(false));
        let ptr = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        let touch = Touch { ptr, generation: gpu.next_generation(ptr) };
        shim.launch(&gpu, first, Some(touch));
        gpu.program_freed(touch);
        let before = gpu.work_calls();
        Shim::free(&shim, &gpu, ptr);
        assert_eq!(gpu.work_calls() - before, 1, "seed {seed}: a kept free is one mark on the legacy stream");
        let before = gpu.work_calls();
        let again = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        assert_eq!((again, gpu.work_calls()), (ptr, before), "seed {seed}: the kept block, with no driver call");
        shim.launch(&gpu, second, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
        gpu.drain();
        assert!(gpu.violations().is_empty(), "seed {seed}: {:?}", gpu.violations());
        let device = shim.stats.device(0);
        assert_eq!(device.total(|t| &t.legacy_cached_frees), 1);
        assert_eq!(device.peak_held.load(Ordering::Relaxed), MIB, "the kept block counts as freed, not yet reused");
    }
}

/// Where the hooks see every call that issues work and it all went to the
/// legacy stream since the last mark, a free keeps its block with no mark
/// (by default, on one thread too): the free and the reuse make no driver
/// call, and the new owner's work on any blocking stream still runs after
/// the old owner's. Once work went to another blocking stream or to the
/// per-thread default stream, a free takes one driver call, which covers
/// that work, so that the next free may keep its block with none again: a
/// mark with `SOMA_LEGACY_CACHE=on`, the free on the legacy stream by default.
#[test]
fn a_block_used_on_the_legacy_stream_alone_is_kept_without_a_mark() {
    for (seed, cache) in (0..32).flat_map(|seed| [(seed, "auto"), (seed, "on")]) {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_LEGACY_CACHE", cache)]);
        let blocking = gpu.program_stream(false);
        let mut ptr = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        let mut calls = Vec::new();
        // Each owner works on its stream, then frees; the next takes the block.
        for stream in [Stream::LEGACY, blocking, PER_THREAD, Stream::LEGACY] {
            let touch = Touch { ptr, generation: gpu.next_generation(ptr) };
            shim.launch(&gpu, stream, Some(touch));
            gpu.program_freed(touch);
            let before = gpu.work_calls();
            Shim::free(&shim, &gpu, ptr);
            calls.push(gpu.work_calls() - before);
            ptr = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        }
        shim.launch(&gpu, blocking, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
        gpu.drain();
        assert!(gpu.violations().is_empty(), "seed {seed}, {cache}: {:?}", gpu.violations());
        let device = shim.stats.device(0);
        let kept = (device.total(|t| &t.legacy_cached_frees), device.total(|t| &t.legacy_marked_frees));
        let expected = if cache == "on" { (vec![0, 1, 1, 0], (4, 2)) } else { (vec![0, 1, 1, 0], (2, 0)) };
        assert_eq!((calls, kept), expected, "seed {seed}, {cache}: driver calls of each free; frees kept, and marked");
    }
}

/// A free on the legacy stream (by default, on one thread, once work went
/// off that stream) is issued after that work, so it marks it: a block used
/// on another blocking stream before it is then kept with no mark, and its
/// next owner, on a third blocking stream, still runs after the old work.
#[test]
fn a_free_on_the_legacy_stream_marks_the_work_before_it() {
    for seed in 0..32 {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[]);
        let (x, y) = (gpu.program_stream(false), gpu.program_stream(false));
        let a = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        let b = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        let old = Touch { ptr: b, generation: gpu.next_generation(b) };
        shim.launch(&gpu, x, Some(old));
        Shim::free(&shim, &gpu, a);
        gpu.program_freed(old);
        let calls = gpu.work_calls();
        Shim::free(&shim, &gpu, b);
        let again = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        assert_eq!((again, gpu.work_calls() - calls), (b, 0), "seed {seed}: kept and taken back with no driver call");
        shim.launch(&gpu, y, Some(Touch { ptr: b, generation: gpu.next_generation(b) }));
        gpu.drain();
        assert!(gpu.violations().is_empty(), "seed {seed}: {:?}", gpu.violations());
        let device = shim.stats.device(0);
        let kept = (device.total(|t| &t.legacy_stream_frees), device.total(|t| &t.legacy_cached_frees));
        assert_eq!(kept, (1, 1), "seed {seed}: frees on the legacy stream, kept");
    }
}

/// Two threads keep blocks at once: one takes the device's bit for work
/// off the legacy stream, and before its mark is recorded the other frees a
/// block that work used, takes it back and uses it on another blocking
/// stream. The second free must mark too: the first's mark is not there yet.
#[test]
fn a_free_while_another_frees_mark_is_on_its_way_marks_too() {
    for seed in 0..32 {
        // The other thread's steps borrow both for the life of the process.
        let gpu: &'static SimGpu = Box::leak(Box::new(SimGpu::new(seed, CAPACITY)));
        let shim: &'static Allocator = Box::leak(Box::new(allocator(&[("SOMA_LEGACY_CACHE", "on")])));
        let (first, second) = (gpu.program_stream(false), gpu.program_stream(false));
        let y = Shim::malloc(shim, gpu, MIB).expect("pooled");
        let z = Shim::malloc(shim, gpu, 2 * MIB).expect("pooled");
        let old = Touch { ptr: z, generation: gpu.next_generation(z) };
        shim.launch(gpu, first, Some(old));
        gpu.program_freed(old);
        *gpu.before_next_legacy_record.lock().expect("unpoisoned") = Some(Box::new(move || {
            Shim::free(shim, gpu, z);
            let again = Shim::malloc(shim, gpu, 2 * MIB).expect("pooled");
            assert_eq!(again, z, "seed {seed}: the kept block");
            shim.launch(gpu, second, Some(Touch { ptr: z, generation: gpu.next_generation(z) }));
        }));
        Shim::free(shim, gpu, y);
        assert!(gpu.before_next_legacy_record.lock().expect("unpoisoned").is_none(), "the steps ran");
        gpu.drain();
        assert!(gpu.violations().is_empty(), "seed {seed}: {:?}", gpu.violations());
    }
}

/// A block kept in the legacy stream's order, then a non-blocking stream
/// made while no mark can be recorded: the block is not used on that stream
/// before its old work is done, although marks work again by the next
/// allocation. (The mark recorded at the free covers it; one recorded at
/// the reuse instead did not.) The same for a block kept with no mark, its
/// old work on the legacy stream alone, handed out before the stream is made
/// or after: the last mark is older than its free, so the host waits.
#[test]
fn a_kept_block_is_not_reused_past_a_stream_that_missed_its_mark() {
    let cases = [("on", true, (1, 1), false), ("auto", false, (1, 0), false), ("auto", false, (1, 0), true)];
    for (seed, case) in (0..32).flat_map(|seed| cases.map(|case| (seed, case))) {
        let (cache, old_off_legacy, kept, handed_out_first) = case;
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_LEGACY_CACHE", cache)]);
        let old_stream = if old_off_legacy { gpu.program_stream(false) } else { Stream::LEGACY };
        used_then_freed(&shim, &gpu, old_stream);
        let device = shim.stats.device(0);
        let counted = (device.total(|t| &t.legacy_cached_frees), device.total(|t| &t.legacy_marked_frees));
        assert_eq!(counted, kept, "seed {seed}, {case:?}: frees kept, and marked");
        let early = handed_out_first.then(|| Shim::malloc(&shim, &gpu, MIB).expect("pooled"));
        gpu.fail_legacy_records.store(true, Ordering::Relaxed);
        let nonblocking = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, nonblocking);
        gpu.fail_legacy_records.store(false, Ordering::Relaxed);
        let again = early.unwrap_or_else(|| Shim::malloc(&shim, &gpu, MIB).expect("pooled"));
        shim.launch(&gpu, nonblocking, Some(Touch { ptr: again, generation: gpu.next_generation(again) }));
        gpu.drain();
        assert!(gpu.violations().is_empty(), "seed {seed}, {case:?}: {:?}", gpu.violations());
    }
}

/// The same when the mark fails as a capture begins, and the stream is made
/// during the capture (which forbids the host to wait on the legacy stream):
/// the host waited before the capture began.
#[test]
fn a_block_kept_with_no_mark_is_not_reused_past_a_capture_that_missed_its_mark() {
    for seed in 0..32 {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[]);
        used_then_freed(&shim, &gpu, Stream::LEGACY);
        let captured = gpu.program_stream(false);
        gpu.fail_legacy_records.store(true, Ordering::Relaxed);
        assert!(Shim::begin_capture(&shim, &gpu, captured, CaptureMode::Global), "seed {seed}: the capture began");
        gpu.fail_legacy_records.store(false, Ordering::Relaxed);
        let nonblocking = gpu.program_stream(true);
        Shim::stream_created(&shim, &gpu, nonblocking);
        Shim::end_capture(&shim, &gpu, captured);
        let again = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        shim.launch(&gpu, nonblocking, Some(Touch { ptr: again, generation: gpu.next_generation(again) }));
        gpu.drain();
        assert!(gpu.violations().is_empty(), "seed {seed}: {:?}", gpu.violations());
    }
}

/// A block of 1 MiB, used by work on `stream`, then freed.
fn used_then_freed(shim: &Allocator, gpu: &SimGpu, stream: Stream) {
    let ptr = Shim::malloc(shim, gpu, MIB).expect("pooled");
    let touch = Touch { ptr, generation: gpu.next_generation(ptr) };
    shim.launch(gpu, stream, Some(touch));
    gpu.program_freed(touch);
    Shim::free(shim, gpu, ptr);
}

/// Tracked streams: one found busy at a join is asked again at the next,
/// though it had no work since, because its old work may still use a block
/// of the later batch (one seen idle with no work since is not asked).
#[test]
fn a_stream_busy_at_one_join_is_asked_again_at_the_next() {
    for seed in 0..16 {
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[]);
        let (busy, other) = (gpu.program_stream(true), gpu.program_stream(true));
        Shim::stream_created(&shim, &gpu, busy);
        Shim::stream_created(&shim, &gpu, other);
        let (x, y) = (Shim::malloc(&shim, &gpu, MIB).expect("pooled"), Shim::malloc(&shim, &gpu, MIB).expect("pooled"));
        for _ in 0..8 {
            shim.launch(&gpu, busy, Some(Touch { ptr: 0xdead, generation: 1 }));
        }
        let old = Touch { ptr: y, generation: gpu.next_generation(y) };
        shim.launch(&gpu, busy, Some(Touch { ptr: x, generation: gpu.next_generation(x) }));
        shim.launch(&gpu, busy, Some(old));
        Shim::free(&shim, &gpu, x);
        let _first_join = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        gpu.program_freed(old);
        Shim::free(&shim, &gpu, y);
        let asked = gpu.calls("is_idle");
        let _second_join = Shim::malloc(&shim, &gpu, 3 * MIB).expect("pooled");
        assert_eq!(gpu.calls("is_idle") - asked, 1, "seed {seed}: the busy stream is asked, the other not");
        gpu.synchronize_stream(Stream::LEGACY).expect("synchronized");
        let again = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        assert!(again != y || !reused_early(&shim, &gpu, y, other), "seed {seed}: {:?}", gpu.violations());
    }
}

/// Work issued where the shim's hooks do not see it is not ordered: a
/// stream seen idle is not asked again, and a stream owing a barrier's wait
/// is not made to wait. The checks catch both (so the hooks must cover
/// every call that issues work: scripts/check_work_entry_points.py).
#[test]
fn work_the_hooks_do_not_see_is_caught() {
    let mut caught = [0; 2];
    for (seed, hooked) in (0..16).flat_map(|seed| [(seed, true), (seed, false)]) {
        let launch = |shim: &Allocator, gpu: &SimGpu, stream: Stream, touch: Touch| {
            if hooked {
                shim.launch(gpu, stream, Some(touch));
            } else {
                gpu.launch(stream, touch);
            }
        };
        // A stream seen idle at a join, then work there the hooks miss.
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[]);
        let (seen, other) = (gpu.program_stream(true), gpu.program_stream(true));
        Shim::stream_created(&shim, &gpu, seen);
        Shim::stream_created(&shim, &gpu, other);
        let x = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        shim.launch(&gpu, seen, Some(Touch { ptr: x, generation: gpu.next_generation(x) }));
        gpu.drain();
        Shim::free(&shim, &gpu, x);
        let _joined = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled"); // asks `seen`: idle
        let y = Shim::malloc(&shim, &gpu, 3 * MIB).expect("pooled");
        for _ in 0..8 {
            launch(&shim, &gpu, seen, Touch { ptr: 0xdead, generation: 1 });
        }
        let old = Touch { ptr: y, generation: gpu.next_generation(y) };
        launch(&shim, &gpu, seen, old);
        gpu.program_freed(old);
        Shim::free(&shim, &gpu, y);
        let _joined_again = Shim::malloc(&shim, &gpu, 4 * MIB).expect("pooled");
        gpu.synchronize_stream(Stream::LEGACY).expect("synchronized");
        let again = Shim::malloc(&shim, &gpu, 3 * MIB).expect("pooled");
        let early = again == y && reused_early(&shim, &gpu, y, other);
        assert!(!(hooked && early), "seed {seed}: {:?}", gpu.violations());
        caught[0] += usize::from(early);

        // A barrier's wait owed by a stream whose next work the hooks miss.
        let gpu = SimGpu::new(seed, CAPACITY);
        let shim = allocator(&[("SOMA_FREE_ORDER", "barrier")]);
        let (first, second) = (gpu.program_stream(true), gpu.program_stream(true));
        Shim::stream_created(&shim, &gpu, first);
        Shim::stream_created(&shim, &gpu, second);
        let x = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        let old = program_works_late(&shim, &gpu, x, first);
        gpu.program_freed(old);
        Shim::free(&shim, &gpu, x);
        let _barrier = Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled");
        let again = Shim::malloc(&shim, &gpu, MIB).expect("pooled");
        assert_eq!(again, x, "seed {seed}: the barrier's block comes back at once");
        launch(&shim, &gpu, second, Touch { ptr: x, generation: gpu.next_generation(x) });
        gpu.drain();
        let early = !gpu.violations().early_reuse.is_empty();
        assert!(!(hooked && early), "seed {seed}: {:?}", gpu.violations());
        caught[1] += usize::from(early);
    }
    assert!(caught.iter().all(|&c| c > 0), "missed work caught in {caught:?} of 16 seeds");
}

/// What pool `index` (0: the device's, 1: its pinned host memory's)
/// reserves, and what the program holds there, as `somarun --ps` shows them.
fn reserved_and_in_use(shim: &Allocator, gpu: &SimGpu, index: usize) -> (u64, u64) {
    let usage = shim.usage(gpu, index).expect("the pool");
    (usage.figures[3], usage.figures[0])
}

/// Memory the program stopped using goes back to the driver once the
/// decay's delay (or, shorter, `SOMA_IDLE_MS`) has passed with no
/// allocation or free, by the reclaimer thread alone; what the program
/// holds stays. With the decay off (`SOMA_DECAY_MS=0`) the pool keeps it,
/// until another process asks for it (`give_back`). The device's pool and
/// the pinned host memory pool alike.
#[test]
fn unused_pool_memory_decays_or_is_given_back_when_asked() {
    let settings = [("30", "0"), ("0", "30"), ("600000", "30")];
    for (memory, (decay, idle)) in [Memory::Device, Memory::Host { flags: 0 }].into_iter().flat_map(|m| settings.map(|s| (m, s))) {
        let gpu: &'static SimGpu = Box::leak(Box::new(SimGpu::new(13, CAPACITY)));
        let shim: &'static Allocator = Box::leak(Box::new(allocator(&[
            ("SOMA_DECAY_MS", decay),
            ("SOMA_IDLE_MS", idle),
            ("SOMA_SMALL_BLOCKS", "0"),
        ])));
        let kind = if memory.is_host() { MemoryKind::Host } else { MemoryKind::Device };
        let index = memory.is_host() as usize;
        let alloc = || shim.alloc(gpu, gpu.context(), 4 * MIB, 0, memory).expect("pooled");
        let held = alloc();
        let freed: Vec<u64> = (0..8).map(|_| alloc()).collect();
        for &ptr in &freed {
            shim.launch(gpu, Stream::LEGACY, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
            assert!(matches!(shim.free(gpu, ptr, kind), Freed::Issued { .. }));
        }
        gpu.drain();
        // The GPU runs what the shim issues meanwhile (returns to the pool).
        let background = GpuRunning::start(gpu);
        assert!(shim.start_reclaimer(gpu));
        let started = std::time::Instant::now();
        let mut now = reserved_and_in_use(shim, gpu, index);
        // On: given back within a bound that no load reaches. Off: a while of
        // waiting shows it keeps the memory.
        let wait = std::time::Duration::from_millis(if decay == "0" { 200 } else { 30_000 });
        while now.0 > now.1 && started.elapsed() < wait {
            std::thread::sleep(std::time::Duration::from_millis(5));
            now = reserved_and_in_use(shim, gpu, index);
        }
        let after = started.elapsed();
        let what = format!("{memory:?}, SOMA_DECAY_MS={decay} SOMA_IDLE_MS={idle}");
        if decay == "0" {
            assert_eq!(now, (36 * MIB, 4 * MIB), "{what}: the pool kept what was freed");
            // A give-back waits only briefly for its returns to pass (the GPU
            // thread may not have run them yet under load): what stays goes
            // at the next ask, as a neighbour asks again.
            let mut given_back = 0;
            while given_back < 32 * MIB && started.elapsed() < wait + std::time::Duration::from_secs(30) {
                given_back += shim.give_back(gpu, None);
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            assert_eq!(given_back, 32 * MIB, "{what}");
            now = reserved_and_in_use(shim, gpu, index);
        } else {
            // (With the idle delay, well before the decay's ten minutes.)
            assert!(after >= std::time::Duration::from_millis(30), "{what}: gone after {after:?}, before the delay");
        }
        assert_eq!(now, (4 * MIB, 4 * MIB), "{what}: what the program holds stays, the rest goes");
        assert_eq!(shim.stats.counters(0, memory.is_host()).given_back.load(Ordering::Relaxed), 32 * MIB, "{what}");
        shim.reclaimer.stop();
        background.stop();
        assert!(matches!(shim.free(gpu, held, kind), Freed::Issued { .. }));
        gpu.drain();
        assert!(gpu.violations().is_empty(), "{what}: {:?}", gpu.violations());
    }
}

/// Blocks of at least `SOMA_LARGE_BLOCKS` bytes come from the real allocator
/// (no pool holds them), stay cached when freed, past the pending-free limit,
/// for the next allocation of their size (no driver call), and go back with
/// the real free only once their work is done: when a neighbour asks, and not
/// before. With only blocking streams, and with a non-blocking one.
#[test]
fn large_blocks_come_from_the_real_allocator_and_go_back_to_it_after_their_work() {
    for (seed, nonblocking) in (0..8).flat_map(|seed| [(seed, false), (seed, true)]) {
        let gpu = SimGpu::new(seed, CAPACITY);
        // The neighbour's ask alone gives it back here: not the idle rule, which a stalled test thread would start.
        let shim = allocator(&[("SOMA_LARGE_BLOCKS", "2MiB"), ("SOMA_PENDING_FREE_LIMIT", "1MiB"), ("SOMA_IDLE_MS", "0")]);
        let stream = if nonblocking {
            let stream = gpu.program_stream(true);
            Shim::stream_created(&shim, &gpu, stream);
            stream
        } else {
            Stream::LEGACY
        };
        let large = Shim::malloc(&shim, &gpu, 3 * MIB).expect("served");
        let small = Shim::malloc(&shim, &gpu, MIB).expect("served");
        assert_eq!(gpu.pool_of(large), None, "{seed}: the large block is the real allocator's");
        assert!(gpu.pool_of(small).is_some(), "{seed}: the small one the pool's");
        for ptr in [large, small] {
            let touch = Touch { ptr, generation: gpu.next_generation(ptr) };
            shim.launch(&gpu, stream, Some(touch));
            gpu.program_freed(touch);
            Shim::free(&shim, &gpu, ptr);
        }
        gpu.progress(1);
        if nonblocking {
            gpu.drain(); // the frees pass, and the reclaimer's step caches the block
            shim.reclaim_all(&gpu);
        }
        let before = gpu.work_calls();
        let again = Shim::malloc(&shim, &gpu, 3 * MIB).expect("served");
        assert_eq!((again, gpu.work_calls()), (large, before), "{seed}: reused from the cache, with no driver call");
        let touch = Touch { ptr: again, generation: gpu.next_generation(again) };
        shim.launch(&gpu, stream, Some(touch));
        gpu.program_freed(touch);
        Shim::free(&shim, &gpu, again);
        assert!(gpu.is_allocated(large), "{seed}: kept after its free");
        if nonblocking {
            // Joined, passed and cached (a give-back takes only cached blocks).
            shim.reclaim_all(&gpu);
            gpu.drain();
            shim.reclaim_all(&gpu);
        }
        // A neighbour asks while the work may still run (only blocking
        // streams: kept in the legacy stream's order): the real free waits for it.
        let given = shim.give_back(&gpu, None);
        assert!(!gpu.is_allocated(large), "{seed}: given back to the real allocator");
        assert!(given >= 3 * MIB, "{seed}: {given} bytes given back");
        gpu.drain();
        let v = gpu.violations();
        assert!(v.early_reuse.is_empty() && v.misuse.is_empty(), "{seed}: {v:?}");
    }
}

/// The program's own allocators out of memory: every pool gives back what
/// the program freed, the small blocks' pool too, though the frees that
/// return the blocks there wait behind work on the legacy stream when the
/// room is asked for.
#[test]
fn room_for_the_programs_own_allocators_comes_from_every_pool() {
    for small_blocks in ["4MiB", "0"] {
        let gpu = SimGpu::new(13, CAPACITY);
        let shim = allocator(&[("SOMA_SMALL_BLOCKS", small_blocks)]);
        let blocks: Vec<u64> = (0..8).map(|_| Shim::malloc(&shim, &gpu, 2 * MIB).expect("pooled")).collect();
        for &ptr in &blocks {
            shim.launch(&gpu, Stream::LEGACY, Some(Touch { ptr, generation: gpu.next_generation(ptr) }));
            Shim::free(&shim, &gpu, ptr);
        }
        let given = shim.make_room_for_own_allocators(&gpu);
        assert!(given >= 14 * MIB, "SOMA_SMALL_BLOCKS={small_blocks}: {given} bytes given back of 16 MiB freed");
        gpu.drain();
        let v = gpu.violations();
        assert!(v.early_reuse.is_empty() && v.misuse.is_empty(), "SOMA_SMALL_BLOCKS={small_blocks}: {v:?}");
    }
}

/// The model catches a real free of a large block while its work runs: the
/// check above has teeth.
#[test]
fn a_real_free_while_work_runs_is_caught() {
    let gpu = SimGpu::new(1, CAPACITY);
    let ptr = gpu.alloc_now(3 * MIB).expect("room");
    gpu.launch(Stream::LEGACY, Touch { ptr, generation: gpu.next_generation(ptr) });
    gpu.free_now(ptr).expect("live");
    assert_eq!(gpu.violations().early_reuse.len(), 1, "{:?}", gpu.violations());
}

proptest! {
    #![proptest_config(search())]

    /// Memory held (promise 46): a program that allocates large blocks of
    /// varied sizes, keeping a few live, on the legacy stream. Whenever the
    /// shim takes new memory for one, the device holds no more than 1.2
    /// times the program's peak in use, the request counted; and each block
    /// is the program's alone until its free.
    #[test]
    fn what_the_shim_holds_stays_within_its_budget(
        steps in proptest::collection::vec((32u64..=120, 0usize..4), 1..80),
        seed in any::<u64>(),
    ) {
        let gpu = SimGpu::new(seed, 1 << 30);
        let shim = allocator(&[("SOMA_LARGE_BLOCKS", "32MiB"), ("SOMA_IDLE_MS", "0")]);
        let mut live: Vec<(Touch, u64)> = Vec::new();
        let mut peak = 0;
        for (mib, keep) in steps {
            while live.len() > keep {
                let (touch, _) = live.remove(0);
                gpu.program_freed(touch);
                Shim::free(&shim, &gpu, touch.ptr);
            }
            gpu.progress(2);
            let size = mib * MIB;
            let held = gpu.held();
            let ptr = Shim::malloc(&shim, &gpu, size).expect("served");
            let touch = Touch { ptr, generation: gpu.next_generation(ptr) };
            live.push((touch, size));
            let in_use: u64 = live.iter().map(|&(_, size)| size).sum();
            let allowed = super::device::budget::allowed(peak.max(in_use));
            if gpu.held() > held {
                prop_assert!(gpu.held() <= allowed, "{} bytes held for {in_use} in use, peak {peak}: {allowed} allowed", gpu.held());
            }
            peak = peak.max(in_use);
            shim.launch(&gpu, Stream::LEGACY, Some(touch));
        }
        gpu.drain();
        let v = gpu.violations();
        prop_assert!(v.is_empty(), "{v:?}");
    }
}

/// The model's checker keeps its teeth where the driver maps freed memory
/// anew for another size: work on the new block that may run before the work
/// on the memory it came from is caught.
#[test]
fn work_on_memory_mapped_anew_before_the_old_work_finished_is_caught() {
    let caught = (0..16).filter(|&seed| {
        let gpu = SimGpu::new(seed, CAPACITY);
        let pool = gpu.create_pool(0).expect("pool");
        gpu.set_reuse_policies(pool, true, true, false).expect("policies");
        let old = gpu.alloc_from_pool(4 * MIB, pool, Stream::LEGACY).expect("served");
        let touch = Touch { ptr: old, generation: gpu.next_generation(old) };
        gpu.launch(Stream::LEGACY, touch);
        gpu.program_freed(touch);
        gpu.free_async(old, Stream::LEGACY).expect("freed");
        // The same stream: the driver may reuse it at once, for a smaller size.
        let new = gpu.alloc_from_pool(MIB, pool, Stream::LEGACY).expect("served");
        assert_ne!(new, old, "{seed}: mapped anew, at another address");
        // The program's own race: work on a stream that does not wait.
        let unordered = gpu.program_stream(true);
        gpu.launch(unordered, Touch { ptr: new, generation: gpu.next_generation(new) });
        gpu.drain();
        !gpu.violations().early_reuse.is_empty()
    });
    assert!(caught.count() > 0, "no interleaving caught the early reuse");
}
