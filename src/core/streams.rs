//! The streams every free must be ordered after, per context: the live
//! non-blocking streams and the last work of destroyed ones, and the key
//! under which a stream capture is tracked.
//!
//! Where the front door sees every driver call that issues work on a stream
//! (`front/work.rs`), each live non-blocking stream also carries its
//! `StreamWork`: an ordering asks only the streams that may still run work
//! it has not seen finish, and a barrier's wait is issued on a stream just
//! before its next work instead of on every stream at once. Both make an
//! ordering cost follow the streams in use, not the streams alive.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::cuda::gpu::{Context, Event, Stream};

/// Per context: the streams every free there must wait for.
#[derive(Default)]
pub struct StreamRegistry {
    contexts: Vec<(Context, ContextStreams)>,
    /// Every tracked live stream by handle, for the hooks on work.
    work: HashMap<usize, Arc<StreamWork>, BuildHasherDefault<HandleHasher>>,
    /// Contexts forgotten so far (resets): a tail seen before one may be
    /// gone after it, and its handle reused by a new event.
    pub forgotten: u64,
}

#[derive(Default)]
pub struct ContextStreams {
    /// Live non-blocking streams.
    pub nonblocking: Vec<LiveStream>,
    /// Events recorded as the last work of destroyed non-blocking streams.
    pub tails: Vec<Event>,
    /// The barriers ordered in this context, which tracked streams wait for
    /// at their next work.
    pub barriers: Arc<Barriers>,
}

/// The streams a join must wait for, besides the legacy stream.
pub struct Predecessors<'a> {
    pub nonblocking: &'a [LiveStream],
    /// Last work of destroyed streams that may still run.
    pub tails: &'a [Event],
    /// The context's barriers (None: no stream was registered there).
    pub barriers: Option<&'a Barriers>,
}

/// A live non-blocking stream, and what is known of its work if tracked.
pub struct LiveStream {
    pub stream: Stream,
    pub work: Option<Arc<StreamWork>>,
}

/// What the hooks on work tell the ordering about one stream.
pub struct StreamWork {
    /// Calls that began issuing work on the stream, counted before each call.
    started: AtomicU64,
    /// Of those, the calls that returned, counted after each call. While the
    /// two differ, work may be on its way that an answer of the stream's
    /// would not cover, so the stream is asked but not marked idle.
    issued: AtomicU64,
    /// Per pool of the context (`Observer`): `issued` when that pool's
    /// ordering last found the stream idle. Each pool keeps its own, so two
    /// pools ordering at once cannot hide work from each other.
    idle_at: [AtomicU64; 2],
    /// How many of its context's barriers the stream waits for.
    barriers_waited: AtomicU64,
    barriers: Arc<Barriers>,
}

/// `StreamWork::unsettled` while a call is issuing work: the stream is asked
/// but an idle answer marks nothing.
const IN_FLIGHT: u64 = u64::MAX;

/// Which of a context's pools asks a stream: its device memory, or its
/// pinned host memory (each orders its frees on its own).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Observer {
    #[default]
    Device = 0,
    Host = 1,
}

/// Barriers of one context: their number, and the event the latest was
/// recorded into. A wait binds to the event's latest record, which is
/// behind every earlier barrier too.
#[derive(Default)]
pub struct Barriers {
    count: AtomicU64,
    /// The event (0 until the first barrier), created once per context.
    event: AtomicUsize,
}

impl Barriers {
    /// The event barriers are recorded into, if one was made.
    pub fn event(&self) -> Option<Event> {
        let event = self.event.load(Ordering::Acquire);
        (event != 0).then_some(Event(event as *mut _))
    }

    /// Keeps `event` as the one barriers are recorded into.
    pub fn set_event(&self, event: Event) {
        self.event.store(event.0 as usize, Ordering::Release);
    }

    /// A barrier was recorded into the event: every tracked stream owes a
    /// wait for it before its next work. Called before its blocks can be
    /// handed out, so a thread that has one sees the count raised.
    pub fn published(&self) {
        self.count.fetch_add(1, Ordering::Release);
    }
}

impl StreamWork {
    /// A call that issues work on the stream begins.
    pub fn starting(&self) {
        self.started.fetch_add(1, Ordering::AcqRel);
    }

    /// That call returned: its work is on the stream.
    pub fn issued(&self) {
        self.issued.fetch_add(1, Ordering::AcqRel);
    }

    /// If work may have been issued on the stream since `observer` last
    /// found it idle: what to pass to `found_idle` if it is idle now. The
    /// counts are read before asking, so work issued meanwhile is asked
    /// about next time; with a call in flight (returned calls read first,
    /// then started ones, so that one that starts and returns between the
    /// reads still shows) an idle answer marks nothing.
    pub fn unsettled(&self, observer: Observer) -> Option<u64> {
        let issued = self.issued.load(Ordering::Acquire);
        if self.started.load(Ordering::Acquire) != issued {
            return Some(IN_FLIGHT);
        }
        (issued != self.idle_at[observer as usize].load(Ordering::Relaxed)).then_some(issued)
    }

    /// `observer` found the stream idle after `issued` calls had issued work
    /// (`unsettled`'s answer).
    pub fn found_idle(&self, observer: Observer, issued: u64) {
        if issued != IN_FLIGHT {
            self.idle_at[observer as usize].store(issued, Ordering::Relaxed);
        }
    }

    /// The barrier count and event the stream must wait for before its next
    /// work, if it owes one.
    pub fn owed_barrier(&self) -> Option<(u64, Event)> {
        let count = self.barriers.count.load(Ordering::Acquire);
        if self.barriers_waited.load(Ordering::Acquire) >= count {
            return None;
        }
        self.barriers.event().map(|event| (count, event))
    }

    /// The stream waited for the event after `count` barriers were recorded.
    pub fn waited(&self, count: u64) {
        self.barriers_waited.fetch_max(count, Ordering::AcqRel);
    }
}

/// What a null stream handle names in a call that issues work: the legacy
/// stream, or, in the driver's `_ptsz` and `_ptds` variants, the calling
/// thread's per-thread default stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NullStream {
    Legacy,
    PerThread,
}

/// Whether `stream`, as a call with `null` names it, is the legacy stream.
fn is_legacy(stream: Stream, null: NullStream) -> bool {
    stream == Stream::LEGACY || (stream.0.is_null() && null == NullStream::Legacy)
}

/// Work on streams other than the legacy stream (blocking streams of the
/// program, per-thread default streams, non-blocking ones) not yet covered
/// by a mark on each device's legacy stream (one bit per device).
///
/// A block kept in the legacy stream's order (`Device::free`) needs a mark
/// only for such work: the next owner's work, on any blocking stream, waits
/// for the legacy stream's work before it, the old owner's there included.
/// A mark is an event record there, or a free there that runs anyway.
/// Valid only where the hooks see every call that issues work; until one is
/// reported, and once a call may have passed them, every kept free marks.
pub struct SideWork {
    /// A call that issues work was reported: the hooks see them all.
    reported: AtomicBool,
    /// A call that issues work may pass the hooks unseen (a variant of an
    /// entry point the shim does not wrap was handed out).
    unseen: AtomicBool,
    /// Bit `d`: device `d` may have work not marked.
    unmarked: AtomicU64,
    /// Per device: frees that took its bit and have not yet recorded their
    /// mark, or issued their own free on the legacy stream as one
    /// (`issue_as_mark`). Until they have, a free that finds the bit clear
    /// marks too.
    marking: [AtomicU32; 64],
    /// Per device: marks that failed (each set the bit again), so that a
    /// free that found the bit clear sees a failure that came meanwhile.
    failed: [AtomicU32; 64],
}

impl Default for SideWork {
    fn default() -> Self {
        SideWork {
            reported: AtomicBool::new(false),
            unseen: AtomicBool::new(false),
            unmarked: AtomicU64::new(0),
            marking: [const { AtomicU32::new(0) }; 64],
            failed: [const { AtomicU32::new(0) }; 64],
        }
    }
}

impl SideWork {
    /// A call issued work on `streams` (reported once it returned: a mark
    /// that takes the bits before this is recorded after the work).
    /// Written only on a change, as every launch of every thread reports.
    pub fn issued(&self, streams: &[Stream], null: NullStream) {
        if !self.reported.load(Ordering::Relaxed) {
            self.reported.store(true, Ordering::Release);
        }
        let off_legacy = streams.iter().any(|&stream| !is_legacy(stream, null));
        if off_legacy && self.unmarked.load(Ordering::Relaxed) != u64::MAX {
            self.unmarked.fetch_or(u64::MAX, Ordering::AcqRel);
        }
    }

    /// Calls may issue work past the hooks from now on.
    pub fn passes_unseen(&self) {
        self.unseen.store(true, Ordering::Release);
    }

    /// Whether device `ordinal` may have work off the legacy stream not yet
    /// marked there.
    pub fn unmarked(&self, ordinal: i32) -> bool {
        self.blind() || device_bit(ordinal).is_none_or(|bit| self.unmarked.load(Ordering::Acquire) & bit != 0)
    }

    /// Orders a block kept in device `ordinal`'s legacy stream order after
    /// its old owner's work: runs `mark` (a record on that legacy stream) if
    /// work may have gone off the legacy stream since the last mark, or while
    /// the mark of another free that took the bit is not yet recorded.
    /// Whether it marked; None if the mark failed (the work stays unmarked).
    pub fn order_kept(&self, ordinal: i32, mark: impl FnOnce() -> bool) -> Option<bool> {
        self.order_kept_seen(ordinal, mark, || ())
    }

    /// `order_kept`, with `looked` run where a free that found the bit clear
    /// has looked at it and not yet checked the frees in flight: a test's
    /// way to land another thread's steps there.
    fn order_kept_seen(&self, ordinal: i32, mark: impl FnOnce() -> bool, looked: impl FnOnce()) -> Option<bool> {
        let (Some(bit), false) = (device_bit(ordinal), self.blind()) else {
            return mark().then_some(true);
        };
        let (marking, failed) = (&self.marking[ordinal as usize], &self.failed[ordinal as usize]);
        // Counted before the bit is taken: a free that then finds it clear
        // sees the count until this mark is recorded, and a failure (counted
        // before the count drops) once it has failed.
        marking.fetch_add(1, Ordering::SeqCst);
        let failed_before = failed.load(Ordering::SeqCst);
        let took_bit = self.unmarked.fetch_and(!bit, Ordering::SeqCst) & bit != 0;
        if !took_bit {
            looked();
            marking.fetch_sub(1, Ordering::SeqCst);
            // The free that took the bit has recorded its mark.
            if marking.load(Ordering::SeqCst) == 0 && failed.load(Ordering::SeqCst) == failed_before {
                return Some(false);
            }
        }
        let marked = mark();
        if !marked {
            self.unmarked.fetch_or(bit, Ordering::SeqCst);
            failed.fetch_add(1, Ordering::SeqCst);
        }
        if took_bit {
            marking.fetch_sub(1, Ordering::SeqCst);
        }
        marked.then_some(true)
    }

    /// Issues `op`, an operation on device `ordinal`'s legacy stream that
    /// runs anyway (a free there), as a mark: once it has succeeded, the
    /// work off the legacy stream before it is marked, and a block kept
    /// later needs no mark for that work.
    pub fn issue_as_mark<T, E>(&self, ordinal: i32, op: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let bit = device_bit(ordinal).filter(|&bit| !self.blind() && self.unmarked.load(Ordering::Acquire) & bit != 0);
        let Some(bit) = bit else {
            return op(); // nothing to mark
        };
        let (marking, failed) = (&self.marking[ordinal as usize], &self.failed[ordinal as usize]);
        // As in `order_kept_seen`: counted before the bit is taken, and a
        // failure counted before the count drops.
        marking.fetch_add(1, Ordering::SeqCst);
        let took_bit = self.unmarked.fetch_and(!bit, Ordering::SeqCst) & bit != 0;
        let result = op();
        if result.is_err() && took_bit {
            self.unmarked.fetch_or(bit, Ordering::SeqCst);
            failed.fetch_add(1, Ordering::SeqCst);
        }
        marking.fetch_sub(1, Ordering::SeqCst);
        result
    }

    fn blind(&self) -> bool {
        !self.reported.load(Ordering::Acquire) || self.unseen.load(Ordering::Acquire)
    }
}

/// Device `ordinal`'s bit in `SideWork::unmarked`; a device past the 64th
/// has none and always marks.
fn device_bit(ordinal: i32) -> Option<u64> {
    u32::try_from(ordinal).ok().and_then(|ordinal| 1u64.checked_shl(ordinal))
}

/// A capture in progress: the stream's handle and, for the per-thread
/// default stream (one handle, a stream per thread), the thread.
pub type CaptureKey = (usize, u64);

pub fn capture_key(stream: Stream) -> CaptureKey {
    const PER_THREAD: usize = 2; // cudaStreamPerThread / CU_STREAM_PER_THREAD
    let handle = stream.0 as usize;
    // SAFETY: pthread_self has no preconditions.
    let thread = if handle == PER_THREAD { (unsafe { libc::pthread_self() }) as u64 } else { 0 };
    (handle, thread)
}

impl StreamRegistry {
    /// The streams of `context`, registered on first use.
    fn of(&mut self, context: Context) -> &mut ContextStreams {
        let index = match self.contexts.iter().position(|(c, _)| *c == context) {
            Some(index) => index,
            None => {
                self.contexts.push((context, ContextStreams::default()));
                self.contexts.len() - 1
            }
        };
        &mut self.contexts[index].1
    }

    /// Registers the new non-blocking `stream` of `context`, with its work
    /// tracked if `tracked`. How many streams the context now has.
    pub fn add(&mut self, context: Context, stream: Stream, tracked: bool) -> usize {
        let streams = self.of(context);
        // A new stream owes a wait for the latest barrier, if any: simpler
        // than proving the legacy stream's mark covers it, and paid once.
        let work = tracked.then(|| {
            Arc::new(StreamWork {
                started: AtomicU64::new(0),
                issued: AtomicU64::new(0),
                idle_at: [AtomicU64::new(0), AtomicU64::new(0)],
                barriers_waited: AtomicU64::new(0),
                barriers: Arc::clone(&streams.barriers),
            })
        });
        streams.nonblocking.push(LiveStream { stream, work: work.clone() });
        let live = streams.nonblocking.len();
        if let Some(work) = work {
            self.work.insert(stream.0 as usize, work);
        }
        live
    }

    /// Forgets the live non-blocking `stream`: its context and streams, if it was one.
    pub fn remove(&mut self, stream: Stream) -> Option<(Context, &mut ContextStreams)> {
        self.work.remove(&(stream.0 as usize));
        let (context, streams) = self.contexts.iter_mut().find(|(_, streams)| streams.holds(stream))?;
        streams.nonblocking.retain(|live| live.stream != stream);
        Some((*context, streams))
    }

    /// The work record of a tracked live stream.
    pub fn work_of(&self, stream: Stream) -> Option<Arc<StreamWork>> {
        self.work.get(&(stream.0 as usize)).cloned()
    }

    /// What a free in `context` must be ordered after, besides the legacy stream.
    pub fn predecessors(&self, context: Context) -> Predecessors<'_> {
        match self.streams_of(context) {
            Some(streams) => Predecessors {
                nonblocking: &streams.nonblocking,
                tails: &streams.tails,
                barriers: Some(&streams.barriers),
            },
            None => Predecessors { nonblocking: &[], tails: &[], barriers: None },
        }
    }

    /// The streams of `context`, if any was registered.
    pub fn streams_of(&self, context: Context) -> Option<&ContextStreams> {
        self.contexts.iter().find(|(c, _)| *c == context).map(|(_, streams)| streams)
    }

    /// Drops the tails of `context` that `passed` holds.
    pub fn retire_tails(&mut self, context: Context, passed: &HashSet<Event>) {
        self.of(context).tails.retain(|tail| !passed.contains(tail));
    }

    pub fn forget_context(&mut self, context: Context) {
        let work = &mut self.work;
        self.contexts.retain(|(c, streams)| {
            if *c == context {
                streams.nonblocking.iter().for_each(|live| _ = work.remove(&(live.stream.0 as usize)));
            }
            *c != context
        });
        self.forgotten += 1;
    }
}

impl ContextStreams {
    fn holds(&self, stream: Stream) -> bool {
        self.nonblocking.iter().any(|live| live.stream == stream)
    }
}

/// Stream handles are addresses: one multiply, its high half folded into
/// the low bits (which pick the bucket), spreads them at no hashing cost on
/// the hooks' path.
#[derive(Default)]
pub struct HandleHasher(u64);

impl Hasher for HandleHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        bytes.iter().for_each(|&byte| self.write_usize(self.0 as usize ^ usize::from(byte)));
    }

    fn write_usize(&mut self, handle: usize) {
        let product = (handle as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = product ^ (product >> 32);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_off_the_legacy_stream_needs_a_mark_on_every_device_until_each_marks() {
        let side = SideWork::default();
        let marks = std::cell::Cell::new(0);
        let mark = |ok: bool| {
            marks.set(marks.get() + 1);
            ok
        };
        assert!(side.unmarked(0), "nothing reported yet");
        assert_eq!(side.order_kept(0, || mark(true)), Some(true), "nothing reported yet: every free marks");
        let null = Stream(std::ptr::null_mut());
        side.issued(&[Stream::LEGACY, null], NullStream::Legacy);
        assert!(!side.unmarked(0) && !side.unmarked(1), "the legacy stream's work alone");
        assert_eq!(side.order_kept(0, || mark(true)), Some(false));
        side.issued(&[null], NullStream::PerThread);
        assert!(side.unmarked(0) && side.unmarked(1), "a per-thread call's null stream is not the legacy stream");
        assert_eq!(side.order_kept(0, || mark(true)), Some(true));
        assert!(!side.unmarked(0) && side.unmarked(1), "marked on device 0 only");
        side.issued(&[Stream(16 as *mut _)], NullStream::Legacy);
        assert_eq!(side.order_kept(0, || mark(false)), None, "a failed mark");
        assert_eq!(side.order_kept(0, || mark(true)), Some(true), "a failed mark covers nothing");
        assert_eq!(side.order_kept(0, || mark(true)), Some(false), "once marked, nothing until more work");
        assert_eq!(side.order_kept(64, || mark(true)), Some(true), "past the 64th device: always marks");
        assert_eq!(marks.get(), 5);
        side.passes_unseen();
        assert!(side.unmarked(0));
        assert_eq!(side.order_kept(0, || mark(true)), Some(true), "work may pass the hooks: every free marks");
    }

    /// A free that finds the bit clear while the free that took it has not
    /// yet recorded its mark cannot rely on that mark: it marks too.
    #[test]
    fn a_free_during_another_frees_mark_marks_too() {
        let side = SideWork::default();
        side.issued(&[Stream(16 as *mut _)], NullStream::Legacy);
        let during = side.order_kept(0, || {
            let inner = side.order_kept(0, || true);
            assert_eq!(inner, Some(true), "the bit was taken, its mark not yet recorded");
            true
        });
        assert_eq!(during, Some(true));
        assert_eq!(side.order_kept(0, || true), Some(false), "both recorded: none needed");
        side.issued(&[Stream(16 as *mut _)], NullStream::Legacy);
        let failed = side.order_kept(0, || {
            assert_eq!(side.order_kept(0, || false), None);
            false
        });
        assert_eq!(failed, None);
        assert!(side.unmarked(0), "failed marks leave the work unmarked");
    }

    /// A free finds the bit clear while the free that took it is still
    /// marking (with a record, or with its own free on the legacy stream);
    /// that mark then fails (setting the bit again, too late for the first
    /// free's look) before the first free checks: it must mark.
    #[test]
    fn a_free_never_relies_on_a_mark_that_failed() {
        for by_free in [false, true] {
            let side = SideWork::default();
            side.issued(&[Stream(16 as *mut _)], NullStream::Legacy);
            let (marking_tx, marking_rx) = std::sync::mpsc::channel();
            let (resume_tx, resume_rx) = std::sync::mpsc::channel::<()>();
            let side = &side;
            std::thread::scope(|scope| {
                let failing = scope.spawn(move || {
                    let fail = || {
                        marking_tx.send(()).expect("the test waits");
                        resume_rx.recv().expect("the test resumes it");
                    };
                    let failed = if by_free {
                        side.issue_as_mark(0, || Err::<(), ()>(fail())).is_err()
                    } else {
                        side.order_kept(0, || {
                            fail();
                            false
                        })
                        .is_none()
                    };
                    assert!(failed, "by a free on the legacy stream: {by_free}");
                });
                marking_rx.recv().expect("the failing free took the bit");
                let mut failing = Some(failing);
                let looked = || {
                    resume_tx.send(()).expect("the failing free waits");
                    failing.take().expect("once").join().expect("its mark failed");
                };
                let marked = side.order_kept_seen(0, || true, looked);
                assert_eq!(marked, Some(true), "the failed mark is not relied on (by a free: {by_free})");
            });
        }
    }

    #[test]
    fn an_operation_on_the_legacy_stream_after_the_work_off_it_marks_that_work() {
        let side = SideWork::default();
        side.issued(&[Stream(16 as *mut _)], NullStream::Legacy);
        assert_eq!(side.issue_as_mark(0, || Err::<(), _>("failed")), Err("failed"));
        assert!(side.unmarked(0), "a failed operation marks nothing");
        let during = side.issue_as_mark(0, || {
            assert_eq!(side.order_kept(0, || true), Some(true), "until it is issued, a kept free marks");
            Ok::<_, ()>(7)
        });
        assert_eq!(during, Ok(7));
        assert!(!side.unmarked(0) && side.unmarked(1), "issued on device 0: its work is marked there");
        assert_eq!(side.order_kept(0, || true), Some(false), "a block kept now needs no mark");
    }

    fn tracked_stream() -> (StreamRegistry, Arc<StreamWork>, Arc<Barriers>) {
        let mut registry = StreamRegistry::default();
        let context = Context(8 as *mut _);
        let stream = Stream(16 as *mut _);
        registry.add(context, stream, true);
        let work = registry.work_of(stream).expect("tracked");
        let barriers = Arc::clone(&registry.streams_of(context).expect("registered").barriers);
        (registry, work, barriers)
    }

    #[test]
    fn each_pool_sees_a_stream_settle_on_its_own() {
        let (_registry, work, _) = tracked_stream();
        assert_eq!(work.unsettled(Observer::Device), None, "a new stream has no work");
        work.starting();
        work.issued();
        let issued = work.unsettled(Observer::Device).expect("work issued");
        assert!(work.unsettled(Observer::Host).is_some());
        work.starting(); // while the device pool asks: not covered by its answer
        work.issued();
        work.found_idle(Observer::Device, issued);
        assert!(work.unsettled(Observer::Device).is_some(), "work issued while asking is asked about next time");
        let issued = work.unsettled(Observer::Device).expect("unsettled");
        work.found_idle(Observer::Device, issued);
        assert_eq!(work.unsettled(Observer::Device), None);
        assert!(work.unsettled(Observer::Host).is_some(), "the host pool has not seen it idle");
        work.starting(); // a call in flight: its work may not be on the stream yet
        let in_flight = work.unsettled(Observer::Device).expect("asked");
        work.found_idle(Observer::Device, in_flight);
        work.issued();
        assert!(work.unsettled(Observer::Device).is_some(), "an idle answer during a call marks nothing");
    }

    #[test]
    fn a_stream_owes_the_latest_barrier_until_it_waits() {
        let (_registry, work, barriers) = tracked_stream();
        assert_eq!(work.owed_barrier(), None, "no barrier yet");
        let event = Event(32 as *mut _);
        barriers.set_event(event);
        barriers.published();
        assert_eq!(work.owed_barrier(), Some((1, event)));
        work.waited(1);
        assert_eq!(work.owed_barrier(), None);
        barriers.published();
        barriers.published();
        assert_eq!(work.owed_barrier(), Some((3, event)), "one wait covers every barrier before it");
        work.waited(2); // a slower thread's wait does not undo a later one
        work.waited(3);
        work.waited(2);
        assert_eq!(work.owed_barrier(), None);
    }

    #[test]
    fn a_forgotten_context_takes_its_streams_out_of_the_hooks_view() {
        let (mut registry, _, _) = tracked_stream();
        let context = Context(8 as *mut _);
        registry.add(context, Stream(24 as *mut _), false);
        assert!(registry.work_of(Stream(24 as *mut _)).is_none(), "an untracked stream has no record");
        registry.forget_context(context);
        assert!(registry.work_of(Stream(16 as *mut _)).is_none());
        assert!(registry.remove(Stream(16 as *mut _)).is_none());
    }
}
