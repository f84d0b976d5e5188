//! Regenerating sections of `BENCHMARKS.md` in place.
//!
//! A generated section sits between two HTML comments,
//! `<!-- BEGIN GENERATED: id -->` and `<!-- END GENERATED: id -->`; everything outside the
//! markers (hand-written readings of the figures) is left as it is. A section whose markers are
//! missing is appended at the end.

/// A malformed document.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DocError {
    /// A begin marker without its end marker (or the reverse, or twice).
    #[error("BENCHMARKS section {id:?}: {problem}")]
    Markers {
        /// The section.
        id: String,
        /// What is wrong.
        problem: &'static str,
    },
}

/// The begin marker of section `id`.
pub fn begin_marker(id: &str) -> String {
    format!("<!-- BEGIN GENERATED: {id} -->")
}

/// The end marker of section `id`.
pub fn end_marker(id: &str) -> String {
    format!("<!-- END GENERATED: {id} -->")
}

/// Replaces section `id` of `doc` with `body` (or appends it with its markers).
pub fn splice(doc: &str, id: &str, body: &str) -> Result<String, DocError> {
    let (b, e) = (begin_marker(id), end_marker(id));
    let err = |problem| DocError::Markers { id: id.to_string(), problem };
    let nb = doc.matches(&b).count();
    let ne = doc.matches(&e).count();
    let body = body.trim_end_matches('\n');
    match (nb, ne) {
        (0, 0) => {
            let mut out = doc.trim_end_matches('\n').to_string();
            if !out.is_empty() {
                out.push_str("\n\n");
            }
            out.push_str(&format!("{b}\n{body}\n{e}\n"));
            Ok(out)
        }
        (1, 1) => {
            let start = doc.find(&b).expect("counted") + b.len();
            let end = doc.find(&e).expect("counted");
            if end < start {
                return Err(err("end marker before begin marker"));
            }
            Ok(format!("{}\n{body}\n{}", &doc[..start], &doc[end..]))
        }
        (1, 0) => Err(err("begin marker without end marker")),
        (0, 1) => Err(err("end marker without begin marker")),
        _ => Err(err("markers appear more than once")),
    }
}

/// The body of section `id`, if present.
pub fn section<'a>(doc: &'a str, id: &str) -> Option<&'a str> {
    let b = begin_marker(id);
    let start = doc.find(&b)? + b.len();
    let end = doc[start..].find(&end_marker(id))? + start;
    Some(doc[start..end].trim_matches('\n'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_between_markers_and_keeps_the_rest() {
        let doc =
            "# B\n\nintro\n<!-- BEGIN GENERATED: e1 -->\nold\nlines\n<!-- END GENERATED: e1 -->\nreading\n";
        let out = splice(doc, "e1", "new table\n").unwrap();
        assert_eq!(
            out,
            "# B\n\nintro\n<!-- BEGIN GENERATED: e1 -->\nnew table\n<!-- END GENERATED: e1 -->\nreading\n"
        );
        assert_eq!(section(&out, "e1"), Some("new table"));
        // Idempotent.
        assert_eq!(splice(&out, "e1", "new table").unwrap(), out);
    }

    #[test]
    fn appends_missing_sections() {
        let out = splice("# B\n", "qos", "body").unwrap();
        assert_eq!(out, "# B\n\n<!-- BEGIN GENERATED: qos -->\nbody\n<!-- END GENERATED: qos -->\n");
        let both = splice(&out, "e2", "two").unwrap();
        assert_eq!(section(&both, "qos"), Some("body"));
        assert_eq!(section(&both, "e2"), Some("two"));
        assert_eq!(
            splice("", "x", "b").unwrap(),
            "<!-- BEGIN GENERATED: x -->\nb\n<!-- END GENERATED: x -->\n"
        );
    }

    #[test]
    fn broken_markers_fail_loudly() {
        let only_begin = "<!-- BEGIN GENERATED: e1 -->\nx\n";
        assert!(matches!(splice(only_begin, "e1", "y"), Err(DocError::Markers { .. })));
        let reversed = "<!-- END GENERATED: e1 -->\n<!-- BEGIN GENERATED: e1 -->\n";
        assert!(splice(reversed, "e1", "y").is_err());
        let twice = format!("{0}\n{1}\n{0}\n{1}\n", begin_marker("a"), end_marker("a"));
        assert!(splice(&twice, "a", "y").is_err());
        // Another section's markers are not this one's.
        assert!(splice(only_begin, "e2", "y").is_ok());
    }
}
