//! The repository explains itself: every file path the design document, the README, the
//! benchmarks page and the code's comments name exists, and the code points nowhere outside
//! the repository.
#![allow(clippy::expect_used)] // tests: a failed expectation is a failed test, with its message

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Every backticked token of `text` that looks like a repository path.
fn cited_paths(text: &str) -> Vec<String> {
    let tops = ["actors/", "engine/", "schema/", "migrations/", "integration-tests/", "scripts/", "docs/", "deploy/"];
    let files = ["README.md", "Makefile", "Cargo.toml", ".ci/run", "rust-toolchain.toml"];
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|t| t.trim_end_matches(['.', ',', ':']))
        .filter(|t| !t.contains(' ') && (tops.iter().any(|p| t.starts_with(p)) || files.contains(t)))
        .filter(|t| !t.contains('<') && !t.contains('*'))
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_path_the_docs_cite_exists() {
    for doc in ["docs/ARCHITECTURE.md", "docs/BENCHMARKS.md", "README.md"] {
        let text = std::fs::read_to_string(root().join(doc)).unwrap_or_else(|e| panic!("read {doc}: {e}"));
        let cited = cited_paths(&text);
        assert!(doc != "docs/ARCHITECTURE.md" || cited.len() > 50, "{doc} cites only {} paths", cited.len());
        let missing: Vec<&String> = cited.iter().filter(|p| !root().join(p).exists()).collect();
        assert!(missing.is_empty(), "{doc} cites paths that do not exist: {missing:?}");
    }
}

/// Every `.rs` file of the crates, with its text.
fn rust_sources() -> Vec<(PathBuf, String)> {
    let mut files = Vec::new();
    let mut pending =
        vec![root().join("actors"), root().join("engine"), root().join("schema"), root().join("integration-tests")];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a source directory").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("read a source file");
                files.push((path, text));
            }
        }
    }
    files
}

/// The comments of `source`, each run of comment lines joined into one line (a backticked
/// path may wrap).
fn comments(source: &str) -> Vec<String> {
    let mut blocks = vec![String::new()];
    for line in source.lines().map(str::trim_start) {
        match line.strip_prefix("//") {
            Some(text) => {
                let block = blocks.last_mut().expect("one block at least");
                block.push(' ');
                block.push_str(text.trim_start_matches(['/', '!']).trim());
            }
            None if blocks.last().is_some_and(|b| !b.is_empty()) => blocks.push(String::new()),
            None => {}
        }
    }
    blocks.retain(|b| !b.is_empty());
    blocks
}

#[test]
fn every_path_the_code_comments_cite_exists() {
    let (mut cited, mut missing) = (0, Vec::new());
    for (file, text) in rust_sources() {
        for path in comments(&text).iter().flat_map(|c| cited_paths(c)) {
            cited += 1;
            if !root().join(&path).exists() {
                missing.push(format!("{}: {path}", file.display()));
            }
        }
    }
    assert!(cited > 10, "the comments cite only {cited} paths");
    assert!(missing.is_empty(), "comments cite paths that do not exist: {missing:#?}");
}

#[test]
fn the_code_points_nowhere_outside_the_repository() {
    // Built from pieces, so that this file does not name them itself: the design notes the
    // project started from, section signs that cite them, and the folder they live in.
    let forbidden = [["DESIGN", ".md"].concat(), '\u{a7}'.to_string(), ["..", "/", "shared"].concat()];
    let offenders: Vec<String> = rust_sources()
        .into_iter()
        .filter(|(_, text)| forbidden.iter().any(|f| text.contains(f.as_str())))
        .map(|(path, _)| path.display().to_string())
        .collect();
    assert!(offenders.is_empty(), "files citing documents outside the repository: {offenders:?}");
}

#[test]
fn the_path_finder_finds_paths() {
    let found = cited_paths("see `actors/src/store/mod.rs`, `README.md`. and `not a path` or `x.rs`");
    assert_eq!(found, ["actors/src/store/mod.rs", "README.md"]);
    let blocks = comments("/// see `docs/\n/// x` and\nfn f() {} // `README.md`\n//! `Makefile`");
    assert_eq!(blocks, [" see `docs/ x` and", " `Makefile`"]);
}

/// Runs `git` in `dir`, as a fixed author.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .expect("git runs");
    assert!(out.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// `scripts/check-commits.sh` (run by `make lint`) refuses a subject over 72 characters and
/// a body without a blank line after the subject, and passes commits that have neither.
#[test]
fn the_commit_check_refuses_long_subjects_and_passes_short_ones() {
    let dir = std::env::temp_dir().join(format!("tally-commit-check-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let repo = dir.as_path();
    git(repo, &["init", "-q"]);
    git(repo, &["commit", "-q", "--allow-empty", "-m", "Base"]);
    let base = git(repo, &["rev-parse", "HEAD"]);
    let check = |since: &str| {
        std::process::Command::new(root().join("scripts/check-commits.sh"))
            .env("TALLY_COMMITS_REPO", repo)
            .env("TALLY_COMMITS_SINCE", since)
            .output()
            .expect("the check runs")
    };
    git(repo, &["commit", "-q", "--allow-empty", "-m", "Say what changed in few words\n\nWhy, in the body."]);
    let out = check(&base);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let good = git(repo, &["rev-parse", "HEAD"]);
    git(repo, &["commit", "-q", "--allow-empty", "-m", &"A subject that goes on and on ".repeat(3)]);
    let out = check(&good);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("at most 72"), "{said}");
    git(repo, &["commit", "-q", "--allow-empty", "--cleanup=verbatim", "-m", "Short subject\nbody glued on"]);
    let glued = git(repo, &["rev-parse", "HEAD"]);
    let out = check(&format!("{glued}~1"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && said.contains("blank line"), "{said}");
    let _ = std::fs::remove_dir_all(&dir);
}
