//! Reading the limits directory: its YAML files by name, bounded in count and size,
//! following symlinks (Kubernetes ConfigMaps), and the content version of what was read.

use std::borrow::Cow;
use std::path::Path;

use crate::ratelimit_format::RateLimitConfig;
use prost::Message;

use sha2::{Digest, Sha256};

use super::{short, MAX_DIR_BYTES, MAX_DIR_ENTRIES, MAX_FILE_BYTES};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum FileKind {
    // Order matters: names are declared before defaults and overrides use them.
    Names,
    Defaults,
    Overrides,
    Descriptors,
    Quota,
    /// Any other YAML file with a top-level `domain`: envoyproxy/ratelimit's format.
    Ratelimit,
}

impl FileKind {
    pub(super) fn of(file: &str) -> Option<FileKind> {
        let stem = file
            .strip_suffix(".yaml")
            .or_else(|| file.strip_suffix(".yml"))?;
        match stem {
            "names" => Some(FileKind::Names),
            "defaults" => Some(FileKind::Defaults),
            "descriptors" => Some(FileKind::Descriptors),
            "quota" => Some(FileKind::Quota),
            _ if stem.starts_with("overrides") => Some(FileKind::Overrides),
            _ => None,
        }
    }
}

/// Whether a directory entry is a limits file candidate: YAML and not hidden.
pub fn is_config_file(file_name: &str) -> bool {
    !file_name.starts_with('.') && (file_name.ends_with(".yaml") || file_name.ends_with(".yml"))
}

/// Reads every YAML file of `dir`, following symlinks (ConfigMaps link each file to
/// `..data/<file>`), in name order.
pub(super) fn read_dir(dir: &Path) -> Result<Vec<(String, String)>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read directory: {e}"))?;
    let mut files = Vec::new();
    let mut total = 0u64;
    for (seen, entry) in entries.enumerate() {
        if seen >= MAX_DIR_ENTRIES {
            return Err(format!(
                "more than {MAX_DIR_ENTRIES} directory entries: is this the limits directory?"
            ));
        }
        let entry = entry.map_err(|e| format!("cannot read directory: {e}"))?;
        let file_name = short(&entry.file_name().to_string_lossy());
        if !is_config_file(&file_name) {
            continue;
        }
        let path = entry.path();
        // `metadata` follows symlinks; a dangling link or a directory named *.yaml is an error.
        let size = match std::fs::metadata(&path) {
            Ok(meta) if meta.is_file() => meta.len(),
            Ok(_) => return Err(format!("{file_name}: not a regular file")),
            Err(e) => return Err(format!("{file_name}: {e}")),
        };
        total += size;
        if size > MAX_FILE_BYTES || total > MAX_DIR_BYTES {
            return Err(format!(
                "{file_name}: too large ({size} bytes; at most {MAX_FILE_BYTES} per file and \
                 {MAX_DIR_BYTES} in all)"
            ));
        }
        // Read at most one byte past the bound, in case the file grew since `metadata`.
        let mut text = String::new();
        std::fs::File::open(&path)
            .and_then(|f| {
                std::io::Read::read_to_string(
                    &mut std::io::Read::take(f, MAX_FILE_BYTES + 1),
                    &mut text,
                )
            })
            .map_err(|e| format!("{file_name}: cannot read: {e}"))?;
        if text.len() as u64 > MAX_FILE_BYTES {
            return Err(format!(
                "{file_name}: too large (at most {MAX_FILE_BYTES} bytes)"
            ));
        }
        files.push((file_name, text));
    }
    files.sort();
    Ok(files)
}

/// A short hash of the files' names and contents and of the xDS resources (the same
/// content, the same version, whatever the order).
pub(super) fn content_version(files: &[(String, String)], xds: &[RateLimitConfig]) -> String {
    let mut sorted: Vec<(&[u8], Cow<'_, [u8]>)> = files
        .iter()
        .map(|(name, text)| (name.as_bytes(), Cow::Borrowed(text.as_bytes())))
        .collect();
    // Resources are told from files by a name no file has (`/` cannot be in a file name).
    sorted.extend(
        xds.iter()
            .map(|c| (c.name.as_bytes(), Cow::Owned(c.encode_to_vec()))),
    );
    let files_end = files.len();
    let (files_part, xds_part) = sorted.split_at_mut(files_end);
    files_part.sort();
    xds_part.sort();
    let mut hash = Sha256::new();
    for (i, (name, bytes)) in sorted.iter().enumerate() {
        if i == files_end {
            hash.update(b"/xds/");
        }
        hash.update((name.len() as u64).to_le_bytes());
        hash.update(name);
        hash.update((bytes.len() as u64).to_le_bytes());
        hash.update(bytes);
    }
    hex::encode(&hash.finalize()[..8])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::{load, DEFAULTS};
    use crate::config::{LimitTable, LoadError};

    #[test]
    fn empty_files_and_hidden_entries_are_fine() {
        let table = load(&[("defaults.yaml", "# nothing yet\n"), ("overrides.yml", "")]).unwrap();
        assert_eq!(table.override_count(), 0);
        assert!(is_config_file("defaults.yaml"));
        assert!(!is_config_file("..data"));
        assert!(!is_config_file(".defaults.yaml.swp"));
        assert!(!is_config_file("README.md"));
    }

    #[test]
    fn version_follows_content() {
        let a = load(&[("defaults.yaml", DEFAULTS)]).unwrap();
        let b = load(&[("defaults.yaml", DEFAULTS)]).unwrap();
        let c = load(&[("defaults.yaml", "")]).unwrap();
        assert_eq!(a.version(), b.version());
        assert_ne!(a.version(), c.version());
        assert_eq!(a.version().len(), 16);
    }

    #[test]
    fn oversized_files_and_directories_are_refused_by_size() {
        let dir = tempfile::tempdir().unwrap();
        let big = vec![b'#'; (MAX_FILE_BYTES + 1) as usize];
        std::fs::write(dir.path().join("overrides.yaml"), big).unwrap();
        let errors = LimitTable::load_dir(dir.path()).unwrap_err().0;
        assert!(errors[0].reason.contains("too large"), "{}", errors[0]);
        // A symlink to some other file is read like any file, and quoted briefly if bad.
        std::fs::remove_file(dir.path().join("overrides.yaml")).unwrap();
        let other = dir.path().join("secret.txt");
        std::fs::write(&other, format!("password: {}", "s".repeat(5_000))).unwrap();
        std::os::unix::fs::symlink(&other, dir.path().join("defaults.yaml")).unwrap();
        let errors = LimitTable::load_dir(dir.path()).unwrap_err().0;
        let text = LoadError(errors).to_string();
        assert!(text.len() < 600, "{text}");
    }

    #[test]
    fn load_dir_reads_yaml_and_skips_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("defaults.yaml"), DEFAULTS).unwrap();
        std::fs::write(dir.path().join("README.md"), "not config").unwrap();
        std::fs::create_dir(dir.path().join("..data")).unwrap();
        let table = LimitTable::load_dir(dir.path()).unwrap();
        let orders = table.names().get("NewOrdersPerAccount").unwrap();
        assert!(table.default_limit(orders).is_some());
        let missing = LimitTable::load_dir(&dir.path().join("nope")).unwrap_err();
        assert!(missing.to_string().contains("cannot read directory"));
    }
}
