//! `SOMA_TRACE=path`: a timeline of allocation events, as CSV.
//!
//! Each thread formats its events into a buffer of its own and writes it to
//! the file when it is large (or at exit), so the hot path takes no shared
//! lock: the buffer's lock is only ever contended by the final flush.
//!
//! Only whole rows reach the file: a write that fails (a full disk) is cut
//! back to the last whole row, its rows are counted as lost, and the first
//! failure is warned of once (`output::warn`). A forked child writes `<path>.<pid>` (`forked`).

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::locks::lock;
use super::output;

pub const HEADER: &str = "time_us,device,op,size,ptr,in_use,reserved\n";
const FLUSH_AT: usize = 64 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// The pool handed out a block.
    Alloc,
    /// `cudaFree`/`cuMemFree` of a pool block (returned once its work is done).
    Free,
    /// The program freed a pool block itself (`cudaFreeAsync`).
    FreeAsync,
    /// The host pool handed out pinned host memory.
    HostAlloc,
    /// `cudaFreeHost`/`cuMemFreeHost` of a host pool block.
    HostFree,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Alloc => "alloc",
            Op::Free => "free",
            Op::FreeAsync => "free_async",
            Op::HostAlloc => "host_alloc",
            Op::HostFree => "host_free",
        }
    }
}

pub struct Trace {
    path: String,
    start: Instant,
    /// This process's file and buffers: a `Box::leak`ed `Sink`, never freed.
    /// A forked child puts its own in place and leaves its parent's alone,
    /// since a thread the child does not have may have held its locks.
    sink: AtomicPtr<Sink>,
}

/// Where one process's events go.
struct Sink {
    path: String,
    /// `None`: the file could not be made (the events are counted as lost).
    output: Mutex<Option<Output>>,
    /// Every thread's buffer, for the flush at exit.
    buffers: Mutex<Vec<Buffer>>,
    rows_lost: AtomicU64,
}

/// One thread's formatted events, not yet written.
type Buffer = Arc<Mutex<Vec<u8>>>;

/// The file, and how much of it holds whole rows.
struct Output {
    file: File,
    /// An inherited stream (`/dev/stdout`), written in order.
    stream: bool,
    length: u64,
    warned: bool,
}

thread_local! {
    /// This thread's buffer, and the sink it belongs to (a thread that forked
    /// still holds its parent's, which the child must not write).
    static BUFFER: RefCell<Option<(&'static Sink, Buffer)>> = const { RefCell::new(None) };
}

impl Sink {
    /// A sink writing `path`, the header written; if the file cannot be
    /// made, a sink that counts every event as lost, and the error.
    fn create(path: String) -> (Sink, Option<std::io::Error>) {
        let output = output::create(&path).and_then(|opened| {
            let output = Output { stream: opened.stream(), file: opened.file, length: 0, warned: false };
            output.write(HEADER.as_bytes())?;
            Ok(Output { length: HEADER.len() as u64, ..output })
        });
        let (output, error) = match output {
            Ok(output) => (Some(output), None),
            Err(e) => (None, Some(e)),
        };
        let sink = Sink { path, output: Mutex::new(output), buffers: Mutex::default(), rows_lost: AtomicU64::new(0) };
        (sink, error)
    }

    /// Appends `rows` (whole rows) to the file and empties the buffer.
    fn write_out(&self, rows: &mut Vec<u8>) {
        let appended = lock(&self.output).as_mut().is_some_and(|output| output.append(rows, &self.path));
        if !appended {
            let count = rows.iter().filter(|&&b| b == b'\n').count() as u64;
            self.rows_lost.fetch_add(count, Ordering::Relaxed);
        }
        rows.clear();
    }
}

impl Output {
    /// Writes `bytes` after the whole rows.
    fn write(&self, bytes: &[u8]) -> std::io::Result<()> {
        if self.stream {
            (&self.file).write_all(bytes)
        } else {
            self.file.write_all_at(bytes, self.length)
        }
    }

    /// Writes `rows` at the end; false if they could not be, in which case
    /// none of them is left in the file.
    fn append(&mut self, rows: &[u8], path: &str) -> bool {
        match self.write(rows) {
            Ok(()) => {
                self.length += rows.len() as u64;
                true
            }
            Err(e) => {
                // Part of them may have been written: cut back to the last
                // whole row (a stream cannot be).
                if !self.stream {
                    let _ = self.file.set_len(self.length);
                }
                if !std::mem::replace(&mut self.warned, true) {
                    output::warn(format_args!("writing the trace to {path} failed: {e}; events that do not fit are lost"));
                }
                false
            }
        }
    }
}

impl Trace {
    pub fn create(path: &str) -> std::io::Result<Trace> {
        match Sink::create(path.to_string()) {
            (sink, None) => {
                let sink = AtomicPtr::new(Box::leak(Box::new(sink)));
                Ok(Trace { path: path.to_string(), start: Instant::now(), sink })
            }
            (_, Some(e)) => Err(e),
        }
    }

    fn sink(&self) -> &'static Sink {
        // SAFETY: `sink` only ever holds pointers from `Box::leak`, which are
        // never freed, so each is valid for the rest of the process.
        unsafe { &*self.sink.load(Ordering::Acquire) }
    }

    pub fn record(&self, device: i32, op: Op, size: u64, ptr: u64, in_use: u64, reserved: u64) {
        let time_us = self.start.elapsed().as_micros();
        let sink = self.sink();
        let buffer = BUFFER.try_with(|cell| {
            let mut cell = cell.borrow_mut();
            match &*cell {
                Some((owner, buffer)) if std::ptr::eq(*owner, sink) => Arc::clone(buffer),
                _ => {
                    let buffer = Arc::new(Mutex::new(Vec::with_capacity(FLUSH_AT)));
                    lock(&sink.buffers).push(Arc::clone(&buffer));
                    *cell = Some((sink, Arc::clone(&buffer)));
                    buffer
                }
            }
        });
        let Ok(buffer) = buffer else {
            return; // the thread is exiting: the event is dropped
        };
        let mut buffer = lock(&buffer);
        let _ = writeln!(buffer, "{time_us},{device},{},{size},{ptr:#x},{in_use},{reserved}", op.name());
        if buffer.len() >= FLUSH_AT {
            sink.write_out(&mut buffer);
        }
    }

    /// Writes every thread's buffered events (at exit).
    pub fn flush(&self) {
        let sink = self.sink();
        for buffer in lock(&sink.buffers).iter() {
            sink.write_out(&mut lock(buffer));
        }
    }

    /// Events that did not reach the file (a write failed), so far.
    pub fn rows_lost(&self) -> u64 {
        self.sink().rows_lost.load(Ordering::Relaxed)
    }

    /// In a forked child (`pid`), before anything else: from now on events go
    /// to `<path>.<pid>`, under a header of their own; the events the parent
    /// had buffered stay the parent's to write, so none is written twice.
    pub fn forked(&self, pid: u32) {
        let path = output::in_child(&self.path, pid);
        let (sink, error) = Sink::create(path);
        if let Some(e) = error {
            output::warn(format_args!("cannot write the trace to {}: {e}; this process's events are lost", sink.path));
        }
        self.sink.store(Box::leak(Box::new(sink)), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_path(name: &str) -> String {
        // Canonical: a symbolic link in `TMPDIR` would be refused.
        let dir = std::env::temp_dir().canonicalize().unwrap();
        let path = dir.join(format!("somashim-trace-{name}-{}.csv", std::process::id()));
        path.to_str().unwrap().to_string()
    }

    #[test]
    fn a_forked_child_writes_its_own_file_and_never_its_parents_rows() {
        let path = temp_path("fork");
        let trace = Trace::create(&path).unwrap();
        trace.record(0, Op::Alloc, 1, 0x1, 1, 2); // buffered in the "parent"
        trace.forked(4242);
        trace.record(0, Op::Free, 1, 0x1, 0, 2);
        trace.flush();
        let child = output::in_child(&path, 4242);
        let child_text = std::fs::read_to_string(&child).unwrap();
        let parent_text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&child).unwrap();
        std::fs::remove_file(&path).unwrap();
        let rows: Vec<&str> = child_text.lines().collect();
        assert_eq!(rows.len(), 2, "{child_text}");
        assert_eq!((rows[0], rows[1].contains(",0,free,1,0x1,0,2")), (HEADER.trim_end(), true), "{child_text}");
        assert_eq!(parent_text, HEADER, "the parent's buffered row is the parent's to write");
    }

    #[test]
    fn a_failed_write_loses_whole_rows_counts_them_and_leaves_the_file_whole() {
        let path = temp_path("failed");
        std::fs::write(&path, HEADER).unwrap();
        // A file open for reading only: every write fails.
        let file = File::open(&path).unwrap();
        let output = Output { file, stream: false, length: HEADER.len() as u64, warned: false };
        let sink = Sink {
            path: path.clone(),
            output: Mutex::new(Some(output)),
            buffers: Mutex::default(),
            rows_lost: AtomicU64::new(0),
        };
        sink.write_out(&mut b"1,0,alloc,1,0x1,1,2\n2,0,free,1,0x1,0,2\n".to_vec());
        sink.write_out(&mut b"3,0,alloc,1,0x1,1,2\n".to_vec());
        assert_eq!(sink.rows_lost.load(Ordering::Relaxed), 3);
        assert!(lock(&sink.output).as_ref().unwrap().warned);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), HEADER);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn events_from_several_threads_all_reach_the_file() {
        let path = temp_path("threads");
        let trace = Arc::new(Trace::create(&path).unwrap());
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let trace = Arc::clone(&trace);
                std::thread::spawn(move || {
                    for i in 0..5000u64 {
                        trace.record(t, Op::Alloc, 256, 0x1000 + i, i, 2 << 20);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        trace.record(0, Op::Free, 256, 0xabc, 0, 2 << 20);
        trace.flush();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut lines = text.lines();
        assert_eq!(lines.next(), Some(HEADER.trim_end()));
        let rows: Vec<&str> = lines.collect();
        assert_eq!(rows.len(), 4 * 5000 + 1);
        assert!(rows.iter().all(|r| r.split(',').count() == 7));
        assert!(rows.iter().any(|r| r.ends_with(",0,free,256,0xabc,0,2097152")), "last row: {:?}", rows.last());
    }
}
