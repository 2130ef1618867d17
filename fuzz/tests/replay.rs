//! Replays every checked-in corpus through its target's body on the stable
//! toolchain (no libFuzzer, no sanitizers): CI proves each target builds and
//! that its seeds satisfy the target's invariants. A target without a corpus
//! directory, or with an empty one, fails; so does a target missing from
//! `sluice_fuzz::TARGETS`, `fuzz_targets/` or `Cargo.toml`.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

fn dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The checked-in inputs of `target` (`corpus/<target>/seed-*`, sorted), plus
/// any discovered inputs lying beside them (git ignores those).
fn corpus(target: &str) -> Vec<PathBuf> {
    let d = dir().join("corpus").join(target);
    let entries = fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.unwrap_or_else(|e| panic!("{}: {e}", d.display())).path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let seeds = files
        .iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("seed-"))
        })
        .count();
    assert!(seeds > 0, "{}: no seed-* file", d.display());
    files
}

#[test]
fn every_target_replays_its_corpus() {
    let mut replayed = Vec::new();
    for (name, run) in sluice_fuzz::TARGETS {
        let files = corpus(name);
        for f in &files {
            let data = fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
            // A panic names the file: libtest prints it with the message.
            eprintln!("replay {name}: {}", f.display());
            run(&data);
        }
        replayed.push(format!("{name}: {}", files.len()));
    }
    println!("replayed {}", replayed.join(", "));
}

#[test]
fn targets_bins_and_corpora_agree() {
    let listed: BTreeSet<String> = sluice_fuzz::TARGETS
        .iter()
        .map(|(n, _)| (*n).to_owned())
        .collect();
    let names_in = |sub: &str, strip: &str| -> BTreeSet<String> {
        fs::read_dir(dir().join(sub))
            .unwrap_or_else(|e| panic!("{sub}: {e}"))
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter_map(|n| n.strip_suffix(strip).map(str::to_owned))
            .collect()
    };
    assert_eq!(names_in("fuzz_targets", ".rs"), listed, "fuzz_targets/");
    assert_eq!(names_in("corpus", ""), listed, "corpus/");
    let manifest = fs::read_to_string(dir().join("Cargo.toml")).unwrap();
    let bins: BTreeSet<String> = manifest
        .split("\n[[bin]]\n")
        .skip(1)
        .filter_map(|b| {
            let line = b.lines().find(|l| l.trim_start().starts_with("name"))?;
            Some(line.split('"').nth(1)?.to_owned())
        })
        .collect();
    assert_eq!(bins, listed, "[[bin]] entries in Cargo.toml");
}
