//! Sizes as stripefs' command lines take them ([`parse_size`](fn@parse_size)) and print them
//! ([`human`]).
//!
//! The `stripefs` binary and the tools beside it (`ionet-perf`, `stripefs-bench`) read sizes
//! with these functions, so a size means the same everywhere a user types one. Every unit is
//! binary: `k`, `K`, `KB` and `KiB` all mean 1024 bytes, `m` / `MiB` 2^20, `g` / `GiB` 2^30
//! (and `t`, `p`, `e` beyond); a plain number is bytes.
//!
//! ```
//! use stripefs::units::{human, parse_size};
//! assert_eq!(parse_size("64k"), Ok(65536));
//! assert_eq!(parse_size("2GiB"), Ok(2 << 30));
//! assert!(parse_size("64 apples").unwrap_err().contains("\"64 apples\""));
//! assert_eq!(human(3 << 19), "1.5 MiB");
//! ```

/// What a size looks like, for error messages.
const SYNTAX: &str = "expected bytes, optionally with a binary unit: 4096, 64k, 1M, 2GiB";

/// The unit system of every size given on a command line: powers of 1024.
const CONFIG: parse_size::Config = parse_size::Config::new().with_binary();

/// Parses a size in bytes: `4096`, `64k`, `1M`, `1.5m`, `2GiB`, `1 KiB` (units are
/// case-insensitive and binary; a fraction of a byte is rounded). Junk, an empty string,
/// a negative number and a size past `u64::MAX` are refused with a message that quotes the
/// input.
pub fn parse_size(s: &str) -> Result<u64, String> {
    CONFIG.parse_size(s.trim()).map_err(|e| match e {
        parse_size::Error::PosOverflow => format!("size {s:?} is too large"),
        _ => format!("invalid size {s:?}: {SYNTAX}"),
    })
}

/// [`parse_size`](fn@parse_size) for sizes held in a `usize`.
pub fn parse_size_usize(s: &str) -> Result<usize, String> {
    let n = parse_size(s)?;
    usize::try_from(n).map_err(|_| format!("size {s:?} is too large"))
}

/// [`parse_size`](fn@parse_size) for sizes held in a `u32`.
pub fn parse_size_u32(s: &str) -> Result<u32, String> {
    let n = parse_size(s)?;
    u32::try_from(n).map_err(|_| format!("size {s:?} is too large (at most 4 GiB - 1)"))
}

/// A byte count for people, in binary units: bytes below
/// 1 KiB (`1023 B`), then one decimal below 10 (`1.5 MiB`) and whole units from 10 on
/// (`15 MiB`, `1023 KiB`), rounded to the nearest; a value that rounds to 1024 of a unit is
/// written in the next (`1048575` is `1.0 MiB`).
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut i = 0;
    loop {
        let tenths = (v * 10.0).round() / 10.0;
        let shown = if tenths < 10.0 { tenths } else { v.round() };
        if shown >= 1024.0 && i + 1 < UNITS.len() {
            v /= 1024.0;
            i += 1;
            continue;
        }
        return if shown < 10.0 {
            format!("{shown:.1} {}", UNITS[i])
        } else {
            format!("{shown:.0} {}", UNITS[i])
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_bytes_and_binary_units_parse() {
        for (s, n) in [
            ("0", 0),
            ("1023", 1023),
            ("4096", 4096),
            ("64k", 64 << 10),
            ("64K", 64 << 10),
            ("64KiB", 64 << 10),
            ("64kb", 64 << 10),
            ("64KB", 64 << 10),
            ("1m", 1 << 20),
            ("1M", 1 << 20),
            ("1MiB", 1 << 20),
            ("1 MiB", 1 << 20),
            ("2g", 2 << 30),
            ("2GiB", 2 << 30),
            ("1.5k", 1536),
            (" 8 ", 8),
            ("15e", 15 << 60),
        ] {
            assert_eq!(parse_size(s), Ok(n), "{s:?}");
        }
        assert_eq!(parse_size_usize("4k"), Ok(4096));
        assert_eq!(parse_size_u32("1m"), Ok(1 << 20));
    }

    #[test]
    fn junk_is_refused_with_a_message() {
        for s in ["", "x", "1x", "k", "-1", "1..5m", "1m2", "0x10", "ten"] {
            let e = parse_size(s).unwrap_err();
            assert!(e.contains(&format!("{s:?}")) && e.contains("64k"), "{s:?}: {e}");
        }
        assert_eq!(parse_size("16e").unwrap_err(), "size \"16e\" is too large");
        assert!(parse_size_u32("4g").unwrap_err().contains("too large"));
    }

    #[test]
    fn human_sizes_at_the_boundaries() {
        for (n, s) in [
            (0, "0 B"),
            (1, "1 B"),
            (1023, "1023 B"),
            (1024, "1.0 KiB"),
            (1536, "1.5 KiB"),
            (10 * 1024 - 52, "9.9 KiB"),
            (10 * 1024 - 51, "10 KiB"),
            (10 * 1024, "10 KiB"),
            (1023 * 1024, "1023 KiB"),
            ((1 << 20) - 1, "1.0 MiB"),
            (1 << 20, "1.0 MiB"),
            (3 << 19, "1.5 MiB"),
            (5_000_000, "4.8 MiB"),
            (64 << 20, "64 MiB"),
            ((1 << 30) - 1, "1.0 GiB"),
            (1 << 30, "1.0 GiB"),
            (4 << 40, "4.0 TiB"),
            (u64::MAX, "16 EiB"),
        ] {
            assert_eq!(human(n), s, "{n}");
        }
    }
}
