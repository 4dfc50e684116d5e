//! The vocabulary of names bench turns into paths: run ids (one folder under
//! `--results-dir`) and hardware keys (one baseline file `KEY.yaml` under `--baselines`,
//! one key of the history). Every door that takes one (the command line of `bench matrix`,
//! `ingest`, `history`, `baseline accept`; a run folder's `results.json` read by `report`,
//! `history import` and `baseline update`) checks it here, before anything is read or
//! written by it, so a name can never reach outside its folder (`../x`, `/tmp/x`, `a/b`),
//! name the folder itself (`''`, `.`), or carry a newline or an escape into a file name, a
//! terminal or a CI artifact.
//!
//! Both are 1 to [`MAX_ID_LEN`] ASCII letters, digits, `.`, `_` or `-`, not starting with
//! `.` (so neither `..` nor a hidden file). This module sits below every stage and knows
//! nothing of the command line: the caller says which flag or key path the value came from.

/// The longest run id or hardware key.
pub const MAX_ID_LEN: usize = 128;

/// What a name is used as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdKind {
    /// A run id: one folder under `--results-dir`.
    RunId,
    /// A hardware key: one baseline file under `--baselines`.
    HardwareKey,
}

impl IdKind {
    fn rule(self) -> &'static str {
        match self {
            IdKind::RunId => "a run id names one folder under --results-dir",
            IdKind::HardwareKey => {
                "a hardware key names one baseline file (KEY.yaml) under --baselines"
            }
        }
    }
}

/// A run id or hardware key that could name something outside its folder.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{origin} \"{value}\": {}: 1 to {MAX_ID_LEN} letters, digits, `.`, `_` or `-`, not starting with `.`", .kind.rule())]
pub struct IdError {
    /// Where the value came from: a flag (`--run-id`) or a file's key path
    /// (`results/x/results.json: environment.hardware_key`).
    pub origin: String,
    /// The value as it is printed: every control character written out (`\x1b`, `\n`), so
    /// that a key holding an escape sequence is not shown as the valid-looking name left
    /// once the sequence is removed.
    pub value: String,
    pub kind: IdKind,
}

fn ok_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')
}

/// Whether `id` is a valid run id or hardware key (both follow one rule).
pub fn is_valid(id: &str) -> bool {
    !id.is_empty() && id.len() <= MAX_ID_LEN && !id.starts_with('.') && id.chars().all(ok_char)
}

fn check(kind: IdKind, origin: &str, id: &str) -> Result<(), IdError> {
    if is_valid(id) {
        return Ok(());
    }
    let cut: String = id.chars().take(MAX_ID_LEN + 1).collect();
    let mut value = crate::sanitize::inline(&cut).into_owned();
    if id.chars().count() > MAX_ID_LEN + 1 {
        value.push('…');
    }
    Err(IdError {
        origin: origin.to_string(),
        value,
        kind,
    })
}

/// Checks a run id given by `origin` (a flag or a key path).
pub fn check_run_id(origin: &str, id: &str) -> Result<(), IdError> {
    check(IdKind::RunId, origin, id)
}

/// Checks a hardware key given by `origin` (a flag or a key path).
pub fn check_hardware_key(origin: &str, key: &str) -> Result<(), IdError> {
    check(IdKind::HardwareKey, origin, key)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_leave_their_folder_are_refused() {
        for bad in [
            "",
            ".",
            "..",
            "../../x",
            "a/b",
            "/tmp/x",
            "x\n",
            "a\u{1b}]0;t\u{7}",
            ".hidden",
            "a b",
            "é",
        ] {
            assert!(check_run_id("--run-id", bad).is_err(), "{bad:?}");
            assert!(
                check_hardware_key("--hardware-key", bad).is_err(),
                "{bad:?}"
            );
        }
        assert!(check_run_id("--run-id", &"x".repeat(129)).is_err());
        for good in [
            "nightly.1",
            "gh-123-1",
            "h100-sxm-80gb",
            "cpu-x86_64",
            "a..b",
        ] {
            check_run_id("--run-id", good).unwrap();
            check_hardware_key("--hardware", good).unwrap();
        }
        check_run_id("--run-id", &"x".repeat(128)).unwrap();
    }

    proptest::proptest! {
        /// A name that passes names exactly one entry directly inside its folder.
        #[test]
        fn a_valid_name_stays_in_its_folder(id in "\\PC{0,140}") {
            if is_valid(&id) {
                let dir = std::path::Path::new("/results");
                let p = dir.join(&id);
                proptest::prop_assert_eq!(p.parent(), Some(dir));
                proptest::prop_assert_eq!(p.components().count(), 3);
                proptest::prop_assert!(!id.chars().any(char::is_control));
            } else {
                proptest::prop_assert!(check_run_id("--run-id", &id).is_err());
            }
        }
    }

    #[test]
    fn the_message_names_the_origin_and_shows_no_control_character() {
        let e = check_hardware_key("--hardware-key", "../evil\u{1b}[2J\n").unwrap_err();
        let m = e.to_string();
        assert!(m.starts_with("--hardware-key \"../evil"), "{m}");
        assert!(m.contains("baseline file"), "{m}");
        assert!(!m.contains('\u{1b}'), "{m}");
        // The escape is shown written out, not removed: "a" alone would read as a valid key.
        let e = check_hardware_key("environment.hardware_key", "a\u{1b}]0;t\u{7}").unwrap_err();
        assert!(
            e.to_string()
                .starts_with(r#"environment.hardware_key "a\x1b]0;t\x07": "#),
            "{e}"
        );
    }
}
