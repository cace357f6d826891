//! The out-of-memory snapshot (`SOMA_SNAPSHOT`): at the first allocation of
//! device memory the program is told is out of memory (or when `somarun
//! --snapshot PID` asks), the shim writes what held the device's memory, as
//! JSON: every live block it handed out with the library that allocated it,
//! each library's figures (this process's, every device together), its pools,
//! the device's free memory, what the user's other shim processes hold on the
//! device, and the last pool events. `scripts/snapshot_viz.py` prints its
//! summary and turns it into the file PyTorch's memory viewer opens.

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use super::neighbours;
use super::socket_dir::socket_dir;
use crate::core::allocator::state::Allocator;
use crate::core::output;
use crate::cuda::driver;
use crate::cuda::gpu::Gpu;
use crate::cuda::real::{driver as cu, SUCCESS};

/// The snapshot is of the first out-of-memory only: the one that explains.
static TAKEN: AtomicBool = AtomicBool::new(false);

/// The program is about to be told that an allocation of `requested` bytes
/// of device memory is out of memory: the snapshot, if asked for and not
/// yet taken. The first, whatever its size (a request larger than the device
/// is an answer too, as a shape gone wrong): a program that probes sizes past
/// the device spends it there. The device's context is current.
pub fn out_of_memory(allocator: &Allocator, requested: u64) {
    let Some(path) = allocator.snapshot_path() else { return };
    if TAKEN.swap(true, Relaxed) {
        return;
    }
    match write(&path, &snapshot(allocator, Some(requested))) {
        Ok(()) => log::info!("out of memory: snapshot written to {path}"),
        Err(e) => output::warn(format_args!("cannot write the out-of-memory snapshot to {path}: {e}")),
    }
}

/// `somarun --snapshot PID`: the snapshot now, of the first device with a
/// pool, to `<pid>.snapshot.json` in the socket directory (this user's, that
/// no one else may enter). Whether it was written.
pub fn on_request(allocator: &Allocator) -> bool {
    let Some(driver) = driver::loaded() else { return false };
    let first = (0..).map_while(|index| allocator.usage(driver, index)).find(|usage| !usage.host);
    let Some(context) = first.and_then(|usage| allocator.device_context(usage.ordinal)) else { return false };
    let Ok(dir) = socket_dir(&allocator.config) else { return false };
    let path = dir.join(format!("{}.snapshot.json", std::process::id()));
    let Ok(text) = driver.with_context(context, || snapshot(allocator, None)) else { return false };
    match write(&path.to_string_lossy(), &text) {
        Ok(()) => true,
        Err(e) => {
            log::warn!("cannot write the snapshot asked for to {}: {e}", path.display());
            false
        }
    }
}

/// Writes `text` to `path` as the other output files are written.
fn write(path: &str, text: &str) -> std::io::Result<()> {
    output::create(path).and_then(|mut opened| {
        // A snapshot cut short is worse than none.
        opened.file.write_all(text.as_bytes()).inspect_err(|_| {
            let _ = opened.remove();
        })
    })
}

/// The snapshot's JSON, of the current context's device: at an out-of-memory
/// for `requested` bytes, or asked for (None).
fn snapshot(allocator: &Allocator, requested: Option<u64>) -> String {
    let driver = driver::loaded();
    let device = driver.and_then(|d| d.current_device().ok()).unwrap_or(0);
    let uuid = allocator.device_uuid(device).unwrap_or([0; 16]);
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: two out-pointers to locals; the device's context is current.
    if unsafe { cu::cuMemGetInfo_v2(&mut free, &mut total) } != SUCCESS {
        (free, total) = (0, 0);
    }
    let reason = if requested.is_some() { "out of memory" } else { "asked" };
    let command = std::fs::read("/proc/self/cmdline").unwrap_or_default();
    let command = String::from_utf8_lossy(&command).replace('\0', " ");
    let mut out = String::from("{\n");
    let _ = writeln!(out, "  \"format\": \"somashim-snapshot-1\",");
    let _ = writeln!(out, "  \"reason\": \"{reason}\",");
    let _ = writeln!(out, "  \"pid\": {},", std::process::id());
    let _ = writeln!(out, "  \"command\": {},", quoted(command.trim()));
    let _ = writeln!(out, "  \"device\": {device},");
    let _ = writeln!(out, "  \"uuid\": {},", quoted(&uuid_text(&uuid)));
    let _ = writeln!(out, "  \"requested\": {},", requested.unwrap_or(0));
    let _ = writeln!(out, "  \"device_free\": {free},");
    let _ = writeln!(out, "  \"device_total\": {total},");

    let pools = (0..).map_while(|index| driver.and_then(|d| allocator.usage(d, index)));
    let pools: Vec<String> = pools
        .filter(|usage| !usage.host)
        .map(|usage| {
            let [in_use, cached, freed, reserved, peak, given_back] = usage.figures;
            format!(
                "{{\"device\": {}, \"in_use\": {in_use}, \"cached\": {cached}, \"freed_not_reused\": {freed}, \
                 \"reserved\": {reserved}, \"peak_in_use\": {peak}, \"given_back\": {given_back}}}",
                usage.ordinal
            )
        })
        .collect();
    list(&mut out, "pools", &pools);

    let libraries: Vec<String> = allocator
        .libraries
        .figures_by_use()
        .iter()
        .map(|f| {
            format!(
                "{{\"name\": {}, \"in_use\": {}, \"peak\": {}, \"allocations\": {}, \"passed_calls\": {}, \"passed_bytes\": {}}}",
                quoted(&f.name),
                f.in_use,
                f.peak,
                f.allocations,
                f.passed_calls,
                f.passed_bytes
            )
        })
        .collect();
    list(&mut out, "libraries", &libraries);

    let blocks: Vec<String> = allocator
        .live_device_blocks()
        .iter()
        .map(|(ptr, block)| {
            let library = quoted(&allocator.libraries.name_of(block.caller));
            format!("{{\"address\": {ptr}, \"size\": {}, \"device\": {}, \"library\": {library}}}", block.size, block.device)
        })
        .collect();
    list(&mut out, "blocks", &blocks);

    let others: Vec<String> = if allocator.config.neighbours { neighbours::usage_on(&allocator.config, uuid) } else { Vec::new() }
        .iter()
        .map(|(pid, [in_use, cached, freed, reserved, ..])| {
            format!(
                "{{\"pid\": {pid}, \"in_use\": {in_use}, \"cached\": {cached}, \"freed_not_reused\": {freed}, \"reserved\": {reserved}}}"
            )
        })
        .collect();
    list(&mut out, "neighbours", &others);

    let events: Vec<String> = allocator
        .events
        .as_ref()
        .map(|events| events.kept())
        .unwrap_or_default()
        .iter()
        .map(|e| {
            format!(
                "{{\"time_us\": {}, \"op\": \"{}\", \"device\": {}, \"size\": {}, \"address\": {}, \"library\": {}}}",
                e.time_us,
                e.op.name(),
                e.device,
                e.size,
                e.ptr,
                quoted(&allocator.libraries.name_of(e.caller))
            )
        })
        .collect();
    out.push_str("  \"events\": [");
    out.push_str(&items(&events));
    out.push_str("]\n}\n");
    out
}

/// `"name": [items],` on lines of their own.
fn list(out: &mut String, name: &str, items_text: &[String]) {
    let _ = writeln!(out, "  \"{name}\": [{}],", items(items_text));
}

fn items(items: &[String]) -> String {
    if items.is_empty() {
        return String::new();
    }
    format!("\n    {}\n  ", items.join(",\n    "))
}

/// `text` as a JSON string.
fn quoted(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn uuid_text(uuid: &[u8; 16]) -> String {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!("GPU-{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_quoted_as_json_and_uuids_as_nvidia_smi_writes_them() {
        assert_eq!(quoted("a\"b\\c\nd"), "\"a\\\"b\\\\c\\u000ad\"");
        let uuid = [0x2f, 0xd0, 0xea, 0xdb, 0xf3, 0x66, 0xa3, 0x44, 0xd7, 0x9b, 0xb6, 0x80, 0x1a, 0xbb, 0x22, 0xa2];
        assert_eq!(uuid_text(&uuid), "GPU-2fd0eadb-f366-a344-d79b-b6801abb22a2");
        let mut out = String::new();
        list(&mut out, "none", &[]);
        list(&mut out, "two", &["1".into(), "2".into()]);
        assert_eq!(out, "  \"none\": [],\n  \"two\": [\n    1,\n    2\n  ],\n");
    }
}
