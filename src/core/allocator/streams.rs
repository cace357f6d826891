//! Streams and captures: non-blocking streams made and destroyed, the work
//! issued on them, and captures beginning and ending.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::state::Allocator;
use crate::core::locks::{read, write};
use crate::core::streams::{capture_key, NullStream, StreamWork};
use crate::cuda::gpu::{Context, Event, Gpu, Stream};

/// Clears its flag when dropped: a flag taken by one thread at a time.
struct ClearOnDrop<'a>(&'a AtomicBool);

impl Drop for ClearOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

impl Allocator {
    /// Tracks a new non-blocking stream (made in the current context): every
    /// later free waits for its work, and blocks reused on the legacy stream
    /// before it existed are safe for it. `tracked`: the front door sees
    /// every call that issues work on it (`issue_work`).
    pub fn stream_created(&self, driver: &impl Gpu, stream: Stream, tracked: bool) {
        let context = match driver.stream_context(stream) {
            Ok(context) => context,
            Err(e) => return log::warn!("cannot find the context of a new stream: {e:?}"),
        };
        // Lock order: captures, then streams. Held until the end: no capture
        // may begin while the legacy stream is marked or waited for.
        let captures = read(&self.captures);
        let device = self.pooled_device_of(context);
        let host_waits = {
            let mut registry = write(&self.streams);
            let live = registry.add(context, stream, tracked);
            log::debug!("non-blocking stream {:?} made: {live} live in its context", stream.0);
            if tracked {
                self.work_tracked.store(true, Ordering::Relaxed);
            }
            // A host wait on the legacy stream would break a global capture.
            device.as_ref().map(|device| (device, device.leave_legacy_stream(driver, stream, !captures.is_empty())))
        };
        // The host waits without the registry: frees of other threads go on.
        if let Some((device, wait)) = host_waits {
            if let Err(e) = wait.and_then(|wait| device.wait_for_new_stream(driver, stream, wait)) {
                log::warn!("device {}: waiting for the legacy stream failed: {e:?}", device.ordinal);
            }
        }
    }

    /// Called before a stream is destroyed: its last work stays a
    /// predecessor of later frees until the GPU has passed it.
    pub fn stream_destroying(&self, driver: &impl Gpu, stream: Stream) {
        let captures = read(&self.captures);
        let mut registry = write(&self.streams);
        let Some((context, streams)) = registry.remove(stream) else {
            return;
        };
        if captures.keys().any(|(s, _)| *s == stream.0 as usize) {
            return; // nothing may be recorded into a capture
        }
        let tail = driver.with_context(context, || {
            let event = driver.create_event()?;
            driver.record(event, stream).map(|_| event)
        });
        match tail.and_then(|r| r) {
            Ok(event) => streams.tails.push(event),
            Err(e) => log::warn!("cannot record the last work of a destroyed stream: {e:?}"),
        }
    }

    /// Forgets the last work of destroyed streams of `context` that the GPU
    /// has passed: frees wait for it no more, and once none is left they go
    /// on the legacy stream again. The events are asked without the stream
    /// registry's lock, and dropped under its write lock only if one passed
    /// and no other thread holds it (else a later free retries), so no
    /// thread waits on these driver calls. One thread at a time
    /// (`retiring_tails`), so no tail it saw is removed and destroyed by
    /// another meanwhile; only a reset can (the registry counts them). Called
    /// by a free that found tails in `context`.
    pub(super) fn retire_passed_tails(&self, driver: &impl Gpu, context: Context) {
        if self.retiring_tails.swap(true, Ordering::Acquire) {
            return;
        }
        let _retiring = ClearOnDrop(&self.retiring_tails);
        let (forgotten, tails) = {
            let registry = read(&self.streams);
            let tails = registry.streams_of(context).map(|streams| streams.tails.clone()).unwrap_or_default();
            (registry.forgotten, tails)
        };
        let passed: HashSet<Event> = tails.into_iter().filter(|&tail| driver.has_passed(tail)).collect();
        if passed.is_empty() {
            return;
        }
        let Some(mut registry) = self.streams.try_write() else {
            return;
        };
        if registry.forgotten != forgotten {
            return; // a reset: these events are gone, their handles maybe reused
        }
        registry.retire_tails(context, &passed);
        drop(registry);
        for tail in passed {
            let _ = driver.destroy_event(tail);
        }
    }

    /// Runs `issue`, a driver call that issues work on `streams` (`null`:
    /// what a null handle names there), as a tracked stream needs: first the
    /// wait for a barrier it owes (not into a capture: captured work runs
    /// when its graph is launched, and that call waits), then the note that
    /// the stream has work; work off the legacy stream is noted for the
    /// blocks kept in its order (`SideWork`). Called for every such call
    /// only where the front door sees them all (`front/work.rs`).
    pub fn issue_work<T>(
        &self,
        driver: &impl Gpu,
        streams: &[Stream],
        null: NullStream,
        issue: impl FnOnce() -> T,
    ) -> T {
        let issued = if self.work_tracked.load(Ordering::Relaxed) {
            // Nearly every call names one stream: no allocation for it.
            let (one, many): (Option<Arc<StreamWork>>, Vec<Arc<StreamWork>>);
            let tracked = if let [stream] = streams {
                one = self.before_work(driver, *stream);
                one.as_slice()
            } else {
                many = streams.iter().filter_map(|&stream| self.before_work(driver, stream)).collect();
                many.as_slice()
            };
            tracked.iter().for_each(|work| work.starting());
            let issued = issue();
            tracked.iter().for_each(|work| work.issued());
            issued
        } else {
            issue()
        };
        self.note_work(streams, null);
        issued
    }

    /// Work was issued on `streams`: noted for the blocks kept in the legacy
    /// stream's order (`SideWork`). Also for a call that passed the hooks'
    /// other steps (re-entered inside a hook, or after a hook failed).
    pub fn note_work(&self, streams: &[Stream], null: NullStream) {
        self.side_work.issued(streams, null);
    }

    /// Calls may issue work past the hooks from now on: every block kept in
    /// the legacy stream's order takes a mark.
    pub fn work_passes_unseen(&self) {
        self.side_work.passes_unseen();
    }

    /// The work record of `stream` if tracked, after its owed barrier wait.
    fn before_work(&self, driver: &impl Gpu, stream: Stream) -> Option<Arc<StreamWork>> {
        let work = read(&self.streams).work_of(stream)?;
        if let Some((count, event)) = work.owed_barrier() {
            if !driver.is_capturing(stream) {
                match driver.wait_event(stream, event) {
                    Ok(()) => {
                        work.waited(count);
                        self.stats.waits_before_work.fetch_add(1, Ordering::Relaxed);
                    }
                    // The host waits instead: the work must not run early.
                    Err(e) => match driver.wait_for(event) {
                        Ok(()) => work.waited(count),
                        Err(host) => log::warn!(
                            "stream {:?}: waiting for a barrier before its work failed: {e:?}, then on the host: {host:?}",
                            stream.0
                        ),
                    },
                }
            }
        }
        Some(work)
    }

    /// Orders the frees the program issued itself during the captures just
    /// ended: the live non-blocking streams wait for the legacy stream's work
    /// so far, which covers the work before each of them. The captures must
    /// be locked for writing, none in progress, so no allocation comes first.
    fn pay_program_free_orders(&self, driver: &impl Gpu) {
        for device in self.devices.pools().into_iter().filter(|device| device.take_owed_program_free_order()) {
            let registry = read(&self.streams);
            let after = registry.predecessors(device.context);
            let ordered = driver.with_context(device.context, || device.order_before_program_free(driver, &after));
            if let Err(e) = ordered.and_then(|r| r) {
                log::warn!("device {}: ordering streams after a cudaFreeAsync during a capture failed: {e:?}", device.ordinal);
            }
        }
    }

    pub fn capture_in_progress(&self) -> bool {
        !read(&self.captures).is_empty()
    }

    /// Runs the real `begin` with captures locked, recording it if it succeeded.
    pub fn begin_capture(&self, driver: Option<&impl Gpu>, stream: Stream, begin: impl FnOnce() -> bool) {
        let mut captures = write(&self.captures);
        if let (true, Some(driver)) = (captures.is_empty(), driver) {
            for device in self.devices.pools() {
                let marked = driver.with_context(device.context, || device.mark_before_capture(driver));
                if let Err(e) = marked.and_then(|r| r) {
                    log::warn!("device {}: marking the legacy stream before a capture failed: {e:?}", device.ordinal);
                }
            }
        }
        if begin() {
            *captures.entry(capture_key(stream)).or_insert(0) += 1;
        }
    }

    /// Runs the real `end`; the capture is over whatever it returns.
    pub fn end_capture<T>(&self, driver: Option<&impl Gpu>, stream: Stream, end: impl FnOnce() -> T) -> T {
        let result = {
            let mut captures = write(&self.captures);
            let result = end();
            let key = capture_key(stream);
            if let Some(count) = captures.get_mut(&key) {
                *count -= 1;
                if *count == 0 {
                    captures.remove(&key);
                }
            }
            if let (true, Some(driver)) = (captures.is_empty(), driver) {
                self.pay_program_free_orders(driver);
            }
            result
        };
        if let Some(driver) = driver {
            self.issue_deferred_frees(driver);
        }
        result
    }
}
