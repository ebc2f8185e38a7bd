//! The shape of the code, held as tests: the layers (entry → pipeline →
//! shell → core, nothing reaching back up), the core's model below the rest
//! of the core, no import cycle between any two modules, every wait of the
//! pipeline going through its one helper, and no product function over 80
//! lines. Read from the source files, so a new
//! module or function is held to the same rules without a word here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The longest a product function may be, in lines.
const MAX_FUNCTION_LINES: usize = 80;

/// One module: its path (`pipeline::stages::admit`) and its source without
/// the test modules.
struct Module {
    file: PathBuf,
    source: String,
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn modules() -> BTreeMap<String, Module> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src_dir()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("src is readable") {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src_dir()).expect("under src");
            let mut parts: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|p| p.to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            // Test-only modules (`tests.rs`, `fakes.rs`, `tests/`) are not product code.
            if parts.iter().any(|p| p == "tests" || p == "fakes") {
                continue;
            }
            let text = std::fs::read_to_string(&path).expect("a source file");
            out.insert(
                parts.join("::"),
                Module {
                    file: path.clone(),
                    source: without_tests(&text),
                },
            );
        }
    }
    out
}

/// The source without `#[cfg(test)]` modules.
fn without_tests(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut k = 0;
    while k < lines.len() {
        let next = lines.get(k + 1).map_or("", |l| l.trim_start());
        if lines[k].trim() == "#[cfg(test)]" && next.starts_with("mod ") {
            if next.ends_with(';') {
                k += 2;
                continue;
            }
            let mut depth = 0i32;
            k += 1;
            while k < lines.len() {
                depth += brace_balance(lines[k]);
                k += 1;
                if depth <= 0 {
                    break;
                }
            }
            continue;
        }
        out.push(lines[k]);
        k += 1;
    }
    out.join("\n")
}

fn brace_balance(line: &str) -> i32 {
    let opens = line.matches('{').count();
    let closes = line.matches('}').count();
    i32::try_from(opens).unwrap_or(0) - i32::try_from(closes).unwrap_or(0)
}

/// Every `crate::`, `super::` or `self::` path mentioned in `source`, with
/// the items of `use a::{b, c::d}` groups spelled out.
fn paths(source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let code: String = source
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    for (start, _) in code.match_indices("use ") {
        let Some(end) = code[start..].find(';') else {
            continue;
        };
        let stmt: String = code[start + 4..start + end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        expand(&stmt, "", &mut found);
    }
    let bytes = code.as_bytes();
    for root in ["crate::", "super::"] {
        for (at, _) in code.match_indices(root) {
            if at > 0
                && (bytes[at - 1].is_ascii_alphanumeric()
                    || bytes[at - 1] == b'_'
                    || bytes[at - 1] == b':')
            {
                continue;
            }
            let path: String = code[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            found.push(path.trim_end_matches(':').to_owned());
        }
    }
    found
}

/// `a::{b,c::{d,e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand(stmt: &str, prefix: &str, out: &mut Vec<String>) {
    let Some(open) = stmt.find('{') else {
        out.push(format!("{prefix}{stmt}").replace("::self", ""));
        return;
    };
    let head = format!("{prefix}{}", &stmt[..open]);
    let inner = &stmt[open + 1..stmt.len().saturating_sub(1)];
    let mut depth = 0;
    let mut part = String::new();
    for c in inner.chars() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                expand(&std::mem::take(&mut part), &head, out);
                continue;
            }
            _ => {}
        }
        part.push(c);
    }
    if !part.is_empty() {
        expand(&part, &head, out);
    }
}

/// The module a path names from within `from`, if it names one of ours.
fn target(from: &str, path: &str, known: &BTreeMap<String, Module>) -> Option<String> {
    let path = path.split(" as ").next().unwrap_or(path);
    let mut segments: Vec<&str> = path.split("::").collect();
    let mut base: Vec<&str> = if from.is_empty() {
        vec![]
    } else {
        from.split("::").collect()
    };
    match segments.first() {
        Some(&"crate") => {
            base.clear();
            segments.remove(0);
        }
        Some(&"super") => {
            while segments.first() == Some(&"super") {
                base.pop();
                segments.remove(0);
            }
        }
        Some(&"self") => {
            segments.remove(0);
        }
        _ => return None,
    }
    let full: Vec<&str> = base.into_iter().chain(segments).collect();
    (1..=full.len())
        .rev()
        .map(|k| full[..k].join("::"))
        .find(|m| known.contains_key(m))
}

/// Each module's imports of other modules (not of its own ancestors).
fn graph(modules: &BTreeMap<String, Module>) -> BTreeMap<String, BTreeSet<String>> {
    modules
        .iter()
        .map(|(name, m)| {
            let edges = paths(&m.source)
                .iter()
                .filter_map(|p| target(name, p, modules))
                .filter(|t| t != name && !name.starts_with(&format!("{t}::")))
                .collect();
            (name.clone(), edges)
        })
        .collect()
}

#[test]
fn no_two_modules_import_each_other_even_through_others() {
    let modules = modules();
    let graph = graph(&modules);
    let mut cycles = Vec::new();
    for start in graph.keys() {
        // A path back to `start` from any module it imports.
        let mut seen = BTreeSet::new();
        let mut stack: Vec<Vec<String>> = graph[start].iter().map(|t| vec![t.clone()]).collect();
        while let Some(path) = stack.pop() {
            let last = path.last().expect("a non-empty path").clone();
            if last == *start {
                cycles.push(format!("{start} -> {}", path.join(" -> ")));
                break;
            }
            if !seen.insert(last.clone()) {
                continue;
            }
            for next in graph.get(&last).into_iter().flatten() {
                let mut longer = path.clone();
                longer.push(next.clone());
                stack.push(longer);
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles:\n{}", cycles.join("\n"));
}

#[test]
fn each_layer_imports_only_the_layers_below_it() {
    let rank = |m: &str| match m.split("::").next() {
        Some("core") => Some(0),
        Some("shell") => Some(1),
        Some("pipeline") => Some(2),
        Some("entry") => Some(3),
        _ => None,
    };
    let modules = modules();
    let mut wrong = Vec::new();
    for (from, targets) in graph(&modules) {
        for to in targets {
            if let (Some(a), Some(b)) = (rank(&from), rank(&to))
                && b > a
            {
                wrong.push(format!("{from} imports {to}"));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "imports up the layers:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_model_imports_nothing_else_of_the_core() {
    // The facts and ids the rest of the core is written in know no trigger,
    // no rule, no output and no setting: a new module finds them below it.
    let modules = modules();
    let mut wrong = Vec::new();
    for (from, targets) in graph(&modules) {
        if !from.starts_with("core::model") {
            continue;
        }
        for to in targets.iter().filter(|t| !t.starts_with("core::model")) {
            wrong.push(format!("{from} imports {to}"));
        }
    }
    assert!(
        wrong.is_empty(),
        "the model imports from above it:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_core_does_no_io() {
    for (name, m) in modules().iter().filter(|(n, _)| n.starts_with("core")) {
        for io in [
            "tokio::",
            "kube::",
            "aws_sdk_",
            "reqwest",
            "std::fs",
            "std::net::Tcp",
            "hyper::",
        ] {
            assert!(
                !m.source.contains(io),
                "{name} ({}) uses {io}",
                m.file.display()
            );
        }
    }
}

#[test]
fn every_wait_of_the_pipeline_goes_through_its_helper() {
    // `wait` reads the kill switch again after each wait; `lease` renews the
    // Lease on a timer, which no write waits on.
    for (name, m) in modules().iter().filter(|(n, _)| {
        n.starts_with("pipeline") && !["pipeline::wait", "pipeline::lease"].contains(&n.as_str())
    }) {
        assert!(
            !m.source.contains("time::sleep") && !m.source.contains("sleep_until"),
            "{name} sleeps on its own: wait through pipeline::wait, which reads the kill switch again"
        );
    }
}

#[test]
fn no_product_function_is_longer_than_eighty_lines() {
    let mut long = Vec::new();
    for (name, m) in modules() {
        let lines: Vec<&str> = m.source.lines().collect();
        let mut k = 0;
        while k < lines.len() {
            let line = lines[k];
            let trimmed = line.trim_start();
            let indent = line.len() - trimmed.len();
            let is_fn = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "pub(super) fn ",
                "async fn ",
                "pub async fn ",
                "pub(crate) async fn ",
                "pub(super) async fn ",
                "const fn ",
                "pub const fn ",
            ]
            .iter()
            .any(|p| trimmed.starts_with(p));
            if !is_fn {
                k += 1;
                continue;
            }
            let mut end = k;
            while end < lines.len()
                && !lines[end].trim_end().ends_with('{')
                && !lines[end].trim_end().ends_with(';')
            {
                end += 1;
            }
            if end >= lines.len() || lines[end].trim_end().ends_with(';') {
                k = end + 1;
                continue;
            }
            let close = format!("{}}}", " ".repeat(indent));
            let mut last = end + 1;
            while last < lines.len() && lines[last].trim_end() != close {
                last += 1;
            }
            let length = last - k + 1;
            if length > MAX_FUNCTION_LINES {
                long.push(format!(
                    "{name}: {} ({length} lines)",
                    trimmed.split('(').next().unwrap_or(trimmed)
                ));
            }
            k = last + 1;
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FUNCTION_LINES} lines:\n{}",
        long.join("\n")
    );
}
