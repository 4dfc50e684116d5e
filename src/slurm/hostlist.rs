//! Slurm's compressed node lists (`gpu[01-03,07],login1`) expanded into node names, as
//! `scontrol show hostnames` does, without asking the controller: the runner names every
//! node of a job in its results and its progress lines, and a job of a thousand nodes
//! should cost no extra Slurm call to do so.

/// The most names one list expands to; a longer (or malformed) list is kept as Slurm wrote
/// it rather than expanded, so that a hostile or mistyped range cannot exhaust memory.
const MAX_NAMES: usize = 65_536;

/// The node names of a Slurm node list, in Slurm's order; `None` when the list does not
/// parse (unbalanced brackets, a range that runs backwards) or names more than
/// [`MAX_NAMES`] nodes. An empty list or `(null)` has no names.
pub(crate) fn expand(list: &str) -> Option<Vec<String>> {
    let list = list.trim();
    if list.is_empty() || list == "(null)" {
        return Some(vec![]);
    }
    let mut names = Vec::new();
    for entry in split_top(list)? {
        if entry.is_empty() {
            continue;
        }
        expand_entry(entry, &mut names)?;
        if names.len() > MAX_NAMES {
            return None;
        }
    }
    Some(names)
}

/// The names of a node list joined for people: `node1, node2`; past eight nodes, the list
/// as Slurm wrote it with the count (`gpu[001-128] (128 nodes)`).
pub(crate) fn shown(list: &str) -> String {
    match expand(list) {
        Some(names) if !names.is_empty() && names.len() <= 8 => names.join(", "),
        Some(names) if names.len() > 8 => format!("{list} ({} nodes)", names.len()),
        _ => list.to_string(),
    }
}

/// Splits a list at the commas outside brackets; `None` for unbalanced brackets.
fn split_top(list: &str) -> Option<Vec<&str>> {
    let mut out = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in list.char_indices() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    (depth == 0).then(|| {
        out.push(&list[start..]);
        out
    })
}

/// Appends the names of one entry (`prefix[ranges]suffix`, brackets possibly repeated, as
/// in `rack[1-2]-n[01-02]`) to `names`.
fn expand_entry(entry: &str, names: &mut Vec<String>) -> Option<()> {
    let Some(open) = entry.find('[') else {
        names.push(entry.to_string());
        return Some(());
    };
    let close = open + entry[open..].find(']')?;
    let (prefix, ranges, rest) = (&entry[..open], &entry[open + 1..close], &entry[close + 1..]);
    let mut tails = Vec::new();
    expand_entry(rest, &mut tails)?;
    for part in ranges.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let (a, b): (u64, u64) = (lo.trim().parse().ok()?, hi.trim().parse().ok()?);
        if b < a || (b - a) as usize >= MAX_NAMES {
            return None;
        }
        // `01-10` keeps the width of its first number, as Slurm pads.
        let width = lo.trim().len();
        for n in a..=b {
            for t in &tails {
                names.push(format!("{prefix}{n:0width$}{t}"));
                if names.len() > MAX_NAMES {
                    return None;
                }
            }
        }
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand(list).unwrap_or_else(|| panic!("{list} did not expand"))
    }

    #[test]
    fn node_lists_expand_as_scontrol_show_hostnames_does() {
        assert_eq!(names("vm"), ["vm"]);
        assert_eq!(names("node[1-2]"), ["node1", "node2"]);
        assert_eq!(
            names("gpu[08-10,12],login1"),
            ["gpu08", "gpu09", "gpu10", "gpu12", "login1"]
        );
        assert_eq!(
            names("rack[1-2]-n[01-02]"),
            ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]
        );
        assert_eq!(names("a[1]b,c"), ["a1b", "c"]);
        assert!(names("").is_empty() && names("(null)").is_empty());
    }

    #[test]
    fn malformed_or_huge_lists_are_not_expanded() {
        for bad in ["n[1-2", "n]1[", "n[3-1]", "n[a-b]", "n[0-99999999999]"] {
            assert_eq!(expand(bad), None, "{bad}");
        }
        // Many small ranges that add up past the cap.
        let many = format!("n[{}]", ["0-9999"; 10].join(","));
        assert_eq!(expand(&many), None);
    }

    #[test]
    fn lists_are_shown_by_name_up_to_eight_nodes() {
        assert_eq!(shown("node[1-2]"), "node1, node2");
        assert_eq!(shown("gpu[001-128]"), "gpu[001-128] (128 nodes)");
        assert_eq!(shown("n[1-2"), "n[1-2");
    }
}
