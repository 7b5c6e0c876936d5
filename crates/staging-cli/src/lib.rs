//! What the `stage` command and the `stage-bench` benchmark share: the one size grammar of every
//! `SIZE` flag, and the parsing of row ranges.

use safetensors_staging::RowRange;

/// Parses a size with the `parse-size` crate's grammar: a number, optionally fractional, then
/// an optional unit, case-insensitive, `B` optional. `K`/`KB`, `M`/`MB`, `G`/`GB`, `T`/`TB` are
/// decimal (1000); `Ki`/`KiB`, `Mi`/`MiB`, `Gi`/`GiB`, `Ti`/`TiB` are binary (1024). So `4096`,
/// `512MiB`, `2GiB`, `0.5MiB`, `1MB`, `64KiB`. A number without a unit must be a whole number of
/// bytes.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let trimmed = text.trim();
    if trimmed.parse::<f64>().is_ok() && trimmed.parse::<u64>().is_err() {
        return Err(format!("{text:?} is not a whole number of bytes"));
    }
    parse_size::parse_size(trimmed)
        .map_err(|e| format!("{text:?} is not a size like 512MiB, 2GiB or 4096: {e}"))
}

/// Parses `PATTERN=SPEC`, SPEC being `START:END` (rows `START..END` of dimension 0) or
/// `RANK/PARTS` (part `RANK` of `PARTS` near-equal parts).
pub fn parse_rows(text: &str) -> Result<(String, RowRange), String> {
    let (pattern, spec) = text
        .rsplit_once('=')
        .ok_or_else(|| format!("{text:?} is not PATTERN=START:END or PATTERN=RANK/PARTS"))?;
    let rows = spec
        .parse::<RowRange>()
        .map_err(|e| format!("{e} (in {text:?})"))?;
    Ok((pattern.to_owned(), rows))
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    #[rstest]
    #[case("4096", Ok(4096))]
    #[case("64KiB", Ok(64 << 10))]
    #[case("64ki", Ok(64 << 10))]
    #[case("64k", Ok(64_000))]
    #[case("1MiB", Ok(1 << 20))]
    #[case("0.5MiB", Ok(1 << 19))]
    #[case("2GiB", Ok(2 << 30))]
    #[case("1MB", Ok(1_000_000))]
    #[case(" 1 GB ", Ok(1_000_000_000))]
    fn sizes(#[case] text: &str, #[case] expected: Result<u64, ()>) {
        assert_eq!(parse_size(text).map_err(|_| ()), expected);
    }

    #[rstest]
    #[case("12XB")]
    #[case("lots")]
    #[case("-1")]
    #[case("1.3")]
    #[case("")]
    fn bad_sizes(#[case] text: &str) {
        assert!(parse_size(text).is_err(), "{text}");
    }

    #[test]
    fn rows() {
        assert_eq!(
            parse_rows("model.*.weight=2:5").unwrap(),
            ("model.*.weight".to_owned(), RowRange::Rows(2..5))
        );
        assert_eq!(
            parse_rows("w=1/4").unwrap(),
            ("w".to_owned(), RowRange::Part { rank: 1, parts: 4 })
        );
        for bad in ["w", "w=1", "w=a:b", "w=1/x", "w=-1:2"] {
            assert!(parse_rows(bad).is_err(), "{bad}");
        }
    }
}
