//! Helpers of `readme`'s tests that both tiers use (`tests/it/readme.rs`,
//! `tests/full/readme_tools.rs`).

use std::process::Command;

/// The fenced code blocks of `text`: (info string, content).
pub fn code_blocks(text: &str) -> Vec<(String, String)> {
    let mut blocks = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if let Some(info) = line.strip_prefix("```") {
            let mut body = Vec::new();
            for line in lines.by_ref() {
                if line.starts_with("```") {
                    break;
                }
                body.push(line);
            }
            blocks.push((info.trim().to_string(), body.join("\n")));
        }
    }
    blocks
}

/// A page of the documentation, by its path in the repository.
pub fn doc(path: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(ROOT).join(path))
        .unwrap_or_else(|e| panic!("{path}: {e}"))
}

pub fn readme() -> String {
    doc("README.md")
}

/// The text of section `heading` (a `## ` line) up to the next `## ` heading.
pub fn section(text: &str, heading: &str) -> String {
    let start = text
        .find(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("README has no {heading:?}"));
    let rest = &text[start + heading.len() + 2..];
    let end = rest.find("\n## ").unwrap_or(rest.len());
    rest[..end].to_string()
}

/// Runs a README shell command (continuation lines joined) in the repository.
pub fn sh(command: &str) -> std::process::Output {
    Command::new("sh")
        .arg("-c")
        .arg(command.replace("\\\n", " "))
        .current_dir(crate::ROOT)
        .output()
        .unwrap()
}

pub use crate::ROOT;
