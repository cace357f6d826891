//! The crate's import graph, read from its source: imports run one way, down
//! the layers (front doors -> talking to other processes -> core -> CUDA access), and no file imports
//! another that imports it back, directly or through others.
//! `cargo test --test layers -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Module of each source file: `src/core/device.rs` -> `core::device`,
/// `src/core/mod.rs` -> `core`, `src/lib.rs` -> `lib`.
fn modules(dir: &Path, prefix: &str, out: &mut BTreeMap<String, String>) {
    for entry in fs::read_dir(dir).expect("src is readable") {
        let path = entry.expect("an entry").path();
        let name = path.file_stem().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            modules(&path, &format!("{prefix}{name}::"), out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let module = match (prefix, name.as_str()) {
                ("", "lib") => "lib".to_string(),
                (p, "mod") => p.trim_end_matches("::").to_string(),
                (p, n) => format!("{p}{n}"),
            };
            out.insert(module, fs::read_to_string(&path).expect("a source file"));
        }
    }
}

/// The modules `source` (module `me`) refers to, by `crate::`, `$crate::` or `super::`.
fn references(me: &str, source: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let parent = me.rsplit_once("::").map_or("", |(p, _)| p);
    let mut found = BTreeSet::new();
    let code: String = source.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    // The crate root names its modules without `crate::`.
    let root_markers = ["front::", "peers::", "core::", "cuda::"].map(|m| (m, m.trim_end_matches("::")));
    let markers = [("crate::", ""), ("super::", parent)];
    let markers: Vec<(&str, &str)> =
        if me == "lib" { root_markers.iter().chain(&markers[..1]).copied().collect() } else { markers.to_vec() };
    for (marker, base) in markers {
        for (at, _) in code.match_indices(marker) {
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // part of a longer name or path
            }
            let after = &code[at + marker.len()..];
            if after.starts_with('*') {
                continue; // `use super::*` in a file's tests: the file itself
            }
            let rest: String = after.chars().take_while(|c| c.is_alphanumeric() || *c == '_' || *c == ':').collect();
            let mut path: Vec<&str> = if base.is_empty() { vec![] } else { base.split("::").collect() };
            path.extend(rest.split("::").filter(|s| !s.is_empty()));
            // The longest prefix that names a module (a `{...}` import names its parent).
            let target = (1..=path.len()).rev().map(|n| path[..n].join("::")).find(|m| known.contains(m));
            let target = target.unwrap_or_else(|| "lib".to_string()); // an item of the crate root
            // A folder's mod.rs (an ancestor) only declares modules: `super::`
            // inside a file's inner module lands there and names the file itself.
            let ancestor = me.starts_with(&format!("{target}::"));
            if target != me && !ancestor {
                found.insert(target);
            }
        }
    }
    found
}

fn layer(module: &str) -> &str {
    module.split("::").next().unwrap()
}

#[test]
fn imports_run_down_the_layers_without_a_circle() {
    let mut sources = BTreeMap::new();
    modules(Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/src")), "", &mut sources);
    let known: BTreeSet<String> = sources.keys().cloned().collect();
    for (module, source) in &sources {
        if known.iter().any(|m| m.starts_with(&format!("{module}::"))) {
            let code = source.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("//"));
            let declares_only = code.clone().all(|l| l.starts_with("pub mod ") || l.starts_with("mod ") || l.starts_with("#[cfg(test)]"));
            assert!(declares_only || module == "lib", "{module}: a folder's mod.rs should only declare its modules");
        }
    }
    let graph: BTreeMap<String, BTreeSet<String>> =
        sources.iter().map(|(m, s)| (m.clone(), references(m, s, &known))).collect();
    for (module, targets) in &graph {
        println!("{module} -> {}", targets.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    // The layers, top to bottom; a module may import its own layer's and those below.
    let order = ["lib", "front", "peers", "core", "cuda"];
    let rank = |m: &str| order.iter().position(|l| *l == layer(m)).expect("a known layer");
    for (module, targets) in &graph {
        for target in targets {
            // A folder's mod.rs names its own files; within a layer, files only import each other acyclically.
            assert!(
                rank(target) >= rank(module),
                "{module} imports {target}: upwards, from the {} layer to the {} layer",
                layer(module),
                layer(target)
            );
        }
    }
    // No circle: repeatedly remove modules that import nothing left.
    let mut left = graph.clone();
    loop {
        let leaves: Vec<String> =
            left.iter().filter(|(_, t)| t.iter().all(|t| !left.contains_key(t))).map(|(m, _)| m.clone()).collect();
        if leaves.is_empty() {
            break;
        }
        for leaf in leaves {
            left.remove(&leaf);
        }
    }
    assert!(left.is_empty(), "modules importing each other in a circle: {:?}", left.keys().collect::<Vec<_>>());
}
