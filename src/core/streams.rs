//! The streams every free must be ordered after, per context: the live
//! non-blocking streams and the last work of destroyed ones, and the key
//! under which a stream capture is tracked.

use super::pending::Predecessors;
use crate::cuda::gpu::{Context, Event, Stream};

/// Per context: the streams every free there must wait for.
#[derive(Default)]
pub struct StreamRegistry {
    contexts: Vec<(Context, ContextStreams)>,
    /// Contexts forgotten so far (resets): a tail seen before one may be
    /// gone after it, and its handle reused by a new event.
    pub forgotten: u64,
}

#[derive(Default)]
pub struct ContextStreams {
    /// Live non-blocking streams.
    pub nonblocking: Vec<Stream>,
    /// Events recorded as the last work of destroyed non-blocking streams.
    pub tails: Vec<Event>,
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
    pub fn of(&mut self, context: Context) -> &mut ContextStreams {
        let index = match self.contexts.iter().position(|(c, _)| *c == context) {
            Some(index) => index,
            None => {
                self.contexts.push((context, ContextStreams::default()));
                self.contexts.len() - 1
            }
        };
        &mut self.contexts[index].1
    }

    /// What a free in `context` must be ordered after, besides the legacy stream.
    pub fn predecessors(&self, context: Context) -> Predecessors<'_> {
        match self.streams_of(context) {
            Some(streams) => Predecessors { nonblocking: &streams.nonblocking, tails: &streams.tails },
            None => Predecessors { nonblocking: &[], tails: &[] },
        }
    }

    /// The streams of `context`, if any was registered.
    pub fn streams_of(&self, context: Context) -> Option<&ContextStreams> {
        self.contexts.iter().find(|(c, _)| *c == context).map(|(_, streams)| streams)
    }

    /// The context holding the live non-blocking `stream`, with its streams.
    pub fn holding(&mut self, stream: Stream) -> Option<(Context, &mut ContextStreams)> {
        self.contexts
            .iter_mut()
            .find(|(_, streams)| streams.nonblocking.contains(&stream))
            .map(|(context, streams)| (*context, streams))
    }

    pub fn forget_context(&mut self, context: Context) {
        self.contexts.retain(|(c, _)| *c != context);
        self.forgotten += 1;
    }
}
