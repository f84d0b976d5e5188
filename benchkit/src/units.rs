//! Size labels of benchmark tables and plot axes ([`size`]): whole binary units where exact
//! (`4 KiB`, `32 MiB`). Sizes on a command line and sizes for people are `stripefs::units`'
//! (`parse_size`, `human`), the one syntax every binary of the workspace shares.

/// `4096` → `4 KiB`, `1536` → `1.5 KiB`, `100` → `100 B`: a benchmark table's size label
/// (whole units where exact).
pub fn size(bytes: f64) -> String {
    let units = [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)];
    for (u, m) in units {
        let m = m as f64;
        if bytes >= m {
            let v = bytes / m;
            return if (v - v.round()).abs() < 1e-9 { format!("{v:.0} {u}") } else { format!("{v:.1} {u}") };
        }
    }
    format!("{bytes:.0} B")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(size(100.0), "100 B");
        assert_eq!(size(4096.0), "4 KiB");
        assert_eq!(size(1536.0), "1.5 KiB");
        assert_eq!(size((32u64 << 20) as f64), "32 MiB");
        assert_eq!(size((3u64 << 30) as f64), "3 GiB");
    }
}
