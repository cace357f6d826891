//! `SOMA_TRACE=path`: a timeline of allocation events, as CSV.
//!
//! Each thread formats its events into a buffer of its own and writes it to
//! the file when it is large (or at exit), so the hot path takes no shared
//! lock: the buffer's lock is only ever contended by the final flush.

use std::cell::RefCell;
use std::fs::File;
use std::io::Write;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

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
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Alloc => "alloc",
            Op::Free => "free",
            Op::FreeAsync => "free_async",
        }
    }
}

pub struct Trace {
    file: Mutex<File>,
    start: Instant,
    buffers: Mutex<Vec<Arc<Mutex<Vec<u8>>>>>,
}

thread_local! {
    static BUFFER: RefCell<Option<Arc<Mutex<Vec<u8>>>>> = const { RefCell::new(None) };
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Trace {
    pub fn create(path: &str) -> std::io::Result<Trace> {
        let mut file = File::create(path)?;
        file.write_all(HEADER.as_bytes())?;
        Ok(Trace { file: Mutex::new(file), start: Instant::now(), buffers: Mutex::new(Vec::new()) })
    }

    pub fn record(&self, device: i32, op: Op, size: u64, ptr: u64, in_use: u64, reserved: u64) {
        let time_us = self.start.elapsed().as_micros();
        let buffer = BUFFER.try_with(|cell| {
            let mut cell = cell.borrow_mut();
            Arc::clone(cell.get_or_insert_with(|| {
                let buffer = Arc::new(Mutex::new(Vec::with_capacity(FLUSH_AT)));
                lock(&self.buffers).push(Arc::clone(&buffer));
                buffer
            }))
        });
        let Ok(buffer) = buffer else {
            return; // the thread is exiting: the event is dropped
        };
        let mut buffer = lock(&buffer);
        let _ = writeln!(buffer, "{time_us},{device},{},{size},{ptr:#x},{in_use},{reserved}", op.name());
        if buffer.len() >= FLUSH_AT {
            self.write_out(&mut buffer);
        }
    }

    /// Writes every thread's buffered events (at exit).
    pub fn flush(&self) {
        for buffer in lock(&self.buffers).iter() {
            self.write_out(&mut lock(buffer));
        }
        let _ = lock(&self.file).flush();
    }

    fn write_out(&self, buffer: &mut Vec<u8>) {
        if let Err(e) = lock(&self.file).write_all(buffer) {
            log::warn!("writing the trace failed: {e}");
        }
        buffer.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_from_several_threads_all_reach_the_file() {
        let path = std::env::temp_dir().join(format!("somashim-trace-{}.csv", std::process::id()));
        let trace = Arc::new(Trace::create(path.to_str().unwrap()).unwrap());
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
