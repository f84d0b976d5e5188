//! Markdown tables.

/// A Markdown table built row by row.
#[derive(Debug, Clone, Default)]
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with these column titles.
    pub fn new<S: Into<String>>(header: impl IntoIterator<Item = S>) -> Table {
        Table { header: header.into_iter().map(Into::into).collect(), rows: Vec::new() }
    }

    /// Adds a row; missing cells are left empty, extra cells are an error in the caller and
    /// are dropped.
    pub fn row<S: Into<String>>(&mut self, cells: impl IntoIterator<Item = S>) -> &mut Self {
        let mut r: Vec<String> = cells.into_iter().map(Into::into).collect();
        r.resize(self.header.len(), String::new());
        self.rows.push(r);
        self
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// True with no rows.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// The table as GitHub-flavoured Markdown (a trailing newline included).
    pub fn render(&self) -> String {
        let line = |cells: &[String]| {
            let mut s = String::from("|");
            for c in cells {
                s.push(' ');
                s.push_str(&escape(c));
                s.push_str(" |");
            }
            s.push('\n');
            s
        };
        let mut out = line(&self.header);
        out.push('|');
        for _ in &self.header {
            out.push_str("---|");
        }
        out.push('\n');
        for r in &self.rows {
            out.push_str(&line(r));
        }
        out
    }
}

/// Escapes what would break a table cell.
fn escape(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_header_rule_and_escaped_cells() {
        let mut t = Table::new(["size", "tcp", "softib"]);
        t.row(["4 KiB", "1.0", "2.0"]);
        t.row(["a|b", "x\ny"]);
        assert_eq!(t.len(), 2);
        assert_eq!(
            t.render(),
            "| size | tcp | softib |\n|---|---|---|\n| 4 KiB | 1.0 | 2.0 |\n| a\\|b | x y |  |\n"
        );
    }
}
