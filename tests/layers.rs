//! The crate's import graph, read from its source: imports run one way, down
//! the layers (front doors -> talking to other processes -> core -> CUDA
//! access), and no file imports another that imports it back, directly or
//! through others, within a layer or across.
//! `cargo test --test layers -- --nocapture` prints the graph.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// The layers, top to bottom; a module may import its own layer's and those below.
const LAYERS: [&str; 5] = ["lib", "front", "peers", "core", "cuda"];

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

/// The paths a use tree names, read from its start in `text`, each under
/// `prefix`: `a::b` one, `a::{b, c::{d, self}}` three (`a::b`, `a::c::d`,
/// `a::c`); a glob names the path before it. What follows the tree is returned.
fn use_tree<'a>(mut text: &'a str, mut prefix: Vec<&'a str>, out: &mut Vec<Vec<&'a str>>) -> &'a str {
    loop {
        text = text.trim_start();
        if let Some(group) = text.strip_prefix('{') {
            text = group;
            loop {
                text = use_tree(text, prefix.clone(), out).trim_start();
                if let Some(alias) = text.strip_prefix("as ") {
                    text = alias.trim_start().trim_start_matches(|c: char| c.is_alphanumeric() || c == '_').trim_start();
                }
                match (text.strip_prefix(','), text.strip_prefix('}')) {
                    (Some(next), _) if next.trim_start().starts_with('}') => return &next.trim_start()[1..],
                    (Some(next), _) => text = next,
                    (_, Some(after)) => return after,
                    _ => return text, // not Rust this reader knows: stop here
                }
            }
        }
        let length = text.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(text.len());
        let (name, rest) = text.split_at(length);
        if !name.is_empty() && name != "self" {
            prefix.push(name);
        }
        match rest.strip_prefix("::") {
            Some(deeper) if !name.is_empty() => text = deeper,
            _ => {
                out.push(prefix);
                return rest;
            }
        }
    }
}

/// The modules `source` (module `me`) refers to, by `crate::`, `$crate::` or
/// `super::`, grouped imports (`super::{a, b}`) included.
fn references(me: &str, source: &str, known: &BTreeSet<String>) -> BTreeSet<String> {
    let parent = me.rsplit_once("::").map_or("", |(p, _)| p);
    let mut found = BTreeSet::new();
    let code: String = source.lines().filter(|l| !l.trim_start().starts_with("//")).collect::<Vec<_>>().join("\n");
    // The crate root names its modules without `crate::`.
    let root_markers: Vec<(String, String)> = LAYERS[1..].iter().map(|l| (format!("{l}::"), l.to_string())).collect();
    let mut markers = vec![("crate::".to_string(), String::new())];
    if me == "lib" {
        markers.extend(root_markers);
    } else {
        markers.push(("super::".to_string(), parent.to_string()));
    }
    for (marker, base) in &markers {
        for (at, _) in code.match_indices(marker.as_str()) {
            let before = code[..at].chars().last();
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue; // part of a longer name or path
            }
            let after = &code[at + marker.len()..];
            if after.starts_with('*') {
                continue; // `use super::*` in a file's tests: the file itself
            }
            let base: Vec<&str> = if base.is_empty() { vec![] } else { base.split("::").collect() };
            let mut paths = Vec::new();
            use_tree(after, base, &mut paths);
            for path in paths {
                // The longest prefix that names a module.
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
    }
    found
}

fn layer(module: &str) -> &str {
    module.split("::").next().unwrap()
}

/// The crate's graph: each module and the modules it imports.
fn import_graph() -> BTreeMap<String, BTreeSet<String>> {
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
    sources.iter().map(|(m, s)| (m.clone(), references(m, s, &known))).collect()
}

/// A circle of imports, if there is one: its modules in order, the first
/// again at the end. Modules that import nothing left are removed, again and
/// again; each one left imports another left, and following those comes round.
fn a_circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
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
    let mut path = vec![left.keys().next()?.clone()];
    loop {
        let last = path.last().expect("a module");
        let next = left[last].iter().find(|t| left.contains_key(*t)).expect("a module left imports one left").clone();
        if let Some(at) = path.iter().position(|m| *m == next) {
            path.drain(..at);
            path.push(next);
            return Some(path);
        }
        path.push(next);
    }
}

#[test]
fn imports_run_down_the_layers_without_a_circle() {
    let graph = import_graph();
    for (module, targets) in &graph {
        println!("{module} -> {}", targets.iter().cloned().collect::<Vec<_>>().join(", "));
    }
    let rank = |m: &str| LAYERS.iter().position(|l| *l == layer(m)).unwrap_or_else(|| panic!("{m}: a layer not in LAYERS"));
    for (module, targets) in &graph {
        for target in targets {
            assert!(
                rank(target) >= rank(module),
                "{module} imports {target}: upwards, from the {} layer to the {} layer",
                layer(module),
                layer(target)
            );
        }
    }
    if let Some(circle) = a_circle(&graph) {
        panic!("modules importing each other in a circle: {}", circle.join(" -> "));
    }
}

#[test]
fn grouped_imports_and_circles_are_seen() {
    let known: BTreeSet<String> = ["front::a", "front::b", "front::c", "core::d"].map(String::from).into();
    let source = "use super::{a, b::{self, Item}};\nuse crate::core::d::{\n    Thing as Other,\n    more,\n};\nfn f() { super::c::call(); }";
    let found = references("front::x", source, &known);
    assert_eq!(found, ["front::a", "front::b", "front::c", "core::d"].map(String::from).into());
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("a", &["b"][..]),
        ("b", &["c"]),
        ("c", &["a"]),
        ("d", &["a"]),
    ]
    .into_iter()
    .map(|(m, t)| (m.to_string(), t.iter().map(|t| t.to_string()).collect()))
    .collect();
    assert_eq!(a_circle(&graph), Some(["a", "b", "c", "a"].map(String::from).to_vec()));
    let graph: BTreeMap<String, BTreeSet<String>> = graph.into_iter().filter(|(m, _)| m != "c").collect();
    assert_eq!(a_circle(&graph), None);
}
