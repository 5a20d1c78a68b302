//! Buffers with lifetimes: the input of offset assignment, the max-load
//! lower bound, and the MiniMalloc CSV reader.

use serde::{Deserialize, Serialize};

/// A buffer alive over the half-open time interval `[lower, upper)` that
/// needs `size` contiguous bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Buffer {
    pub id: u64,
    pub lower: i64,
    pub upper: i64,
    pub size: u64,
}

impl Buffer {
    pub fn new(id: u64, lower: i64, upper: i64, size: u64) -> Buffer {
        Buffer {
            id,
            lower,
            upper,
            size,
        }
    }

    /// True when the two lifetimes share a time step. An empty lifetime
    /// (`lower >= upper`) overlaps nothing.
    pub fn overlaps_in_time(&self, other: &Buffer) -> bool {
        self.lower < other.upper
            && other.lower < self.upper
            && self.lower < self.upper
            && other.lower < other.upper
    }

    /// Lifetime length (0 for an empty lifetime).
    pub fn length(&self) -> u64 {
        if self.upper > self.lower {
            (self.upper as i128 - self.lower as i128) as u64
        } else {
            0
        }
    }

    /// True when the buffer needs space at some time.
    pub fn is_live(&self) -> bool {
        self.size > 0 && self.lower < self.upper
    }
}

/// `x` rounded up to a multiple of `align` (saturating; `align` 0 is 1).
pub fn align_up(x: u64, align: u64) -> u64 {
    let a = align.max(1);
    match x % a {
        0 => x,
        r => x.saturating_add(a - r),
    }
}

/// The max-load lower bound: the largest total size of buffers alive at
/// one time. No placement can use less memory than this.
pub fn lower_bound(bufs: &[Buffer]) -> u64 {
    let mut events: Vec<(i64, i8, u64)> = Vec::with_capacity(bufs.len() * 2);
    for b in bufs.iter().filter(|b| b.is_live()) {
        // Ends sort before starts at the same time: intervals are half-open.
        events.push((b.lower, 1, b.size));
        events.push((b.upper, -1, b.size));
    }
    events.sort_unstable();
    let (mut cur, mut best) = (0u64, 0u64);
    for (_, kind, size) in events {
        if kind > 0 {
            cur = cur.saturating_add(size);
            best = best.max(cur);
        } else {
            cur = cur.saturating_sub(size);
        }
    }
    best
}

/// The max-load bound when offsets are multiples of `align`: at any time
/// the live buffers stack at aligned offsets, so each but the topmost
/// takes its size rounded up to `align`. The bound is the largest, over
/// time, of the rounded sizes of the live buffers minus the largest
/// rounding among them (the one that can sit on top). Equals
/// [`lower_bound`] when `align` is 1.
pub fn aligned_lower_bound(bufs: &[Buffer], align: u64) -> u64 {
    let a = align.max(1);
    if a == 1 {
        return lower_bound(bufs);
    }
    let mut events: Vec<(i64, i8, u64)> = Vec::with_capacity(bufs.len() * 2);
    for b in bufs.iter().filter(|b| b.is_live()) {
        events.push((b.lower, 1, b.size));
        events.push((b.upper, -1, b.size));
    }
    events.sort_unstable();
    let mut pads: std::collections::BTreeMap<u64, usize> = std::collections::BTreeMap::new();
    let (mut cur, mut best) = (0u64, 0u64);
    for (_, kind, size) in events {
        let pad = align_up(size, a) - size;
        if kind > 0 {
            cur = cur.saturating_add(align_up(size, a));
            *pads.entry(pad).or_default() += 1;
            let top_pad = pads.keys().next_back().copied().unwrap_or(0);
            best = best.max(cur - top_pad);
        } else {
            cur = cur.saturating_sub(align_up(size, a));
            if let Some(c) = pads.get_mut(&pad) {
                *c -= 1;
                if *c == 0 {
                    pads.remove(&pad);
                }
            }
        }
    }
    best
}

/// A malformed MiniMalloc CSV file.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {msg}")]
pub struct CsvError {
    /// 1-based line number.
    pub line: usize,
    pub msg: String,
}

/// Reads MiniMalloc's CSV format: a header naming the columns `id`,
/// `lower`, `upper`, `size` (any order; other columns ignored), then one
/// buffer per line. Blank lines are skipped.
pub fn read_minimalloc_csv(text: &str) -> Result<Vec<Buffer>, CsvError> {
    let mut lines = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty());
    let Some((hline, header)) = lines.next() else {
        return Err(CsvError {
            line: 1,
            msg: "empty file: expected a header `id,lower,upper,size`".into(),
        });
    };
    let cols: Vec<&str> = header.split(',').map(str::trim).collect();
    let find = |name: &str| {
        cols.iter()
            .position(|c| *c == name)
            .ok_or_else(|| CsvError {
                line: hline,
                msg: format!("header lacks column `{name}` (found `{header}`)"),
            })
    };
    let (ci, cl, cu, cs) = (find("id")?, find("lower")?, find("upper")?, find("size")?);
    let mut out = Vec::new();
    for (line, l) in lines {
        let fields: Vec<&str> = l.split(',').map(str::trim).collect();
        if fields.len() < cols.len() {
            return Err(CsvError {
                line,
                msg: format!("expected {} fields, found {}", cols.len(), fields.len()),
            });
        }
        let int = |c: usize, what: &str| -> Result<i64, CsvError> {
            fields[c].parse::<i64>().map_err(|e| CsvError {
                line,
                msg: format!("{what} `{}` is not an integer: {e}", fields[c]),
            })
        };
        let id = int(ci, "id")?;
        let (lower, upper, size) = (int(cl, "lower")?, int(cu, "upper")?, int(cs, "size")?);
        if id < 0 || size < 0 {
            return Err(CsvError {
                line,
                msg: "id and size must not be negative".into(),
            });
        }
        if upper < lower {
            return Err(CsvError {
                line,
                msg: format!("upper {upper} is below lower {lower}"),
            });
        }
        out.push(Buffer::new(id as u64, lower, upper, size as u64));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_csv_and_bound() {
        let b = read_minimalloc_csv("id,lower,upper,size\n0,0,3,4\n1,3,5,4\n2,1,4,2\n").unwrap();
        assert_eq!(b.len(), 3);
        assert_eq!(b[2], Buffer::new(2, 1, 4, 2));
        assert_eq!(lower_bound(&b), 6);
    }

    #[test]
    fn csv_errors_name_the_line() {
        let e = read_minimalloc_csv("id,lower,upper,size\n0,0,x,4\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.msg.contains("upper"), "{e}");
        assert!(read_minimalloc_csv("").is_err());
        assert!(read_minimalloc_csv("id,lower,size\n").is_err());
        assert!(read_minimalloc_csv("id,lower,upper,size\n1,5,2,3\n").is_err());
        assert!(read_minimalloc_csv("id,lower,upper,size\n1,0\n").is_err());
        assert!(read_minimalloc_csv("id,lower,upper,size\n-1,0,1,1\n").is_err());
    }

    #[test]
    fn aligned_bound() {
        // 4 + 4 bytes live together at alignment 16: 16 + 4.
        let b = [Buffer::new(0, 0, 2, 4), Buffer::new(1, 1, 3, 4)];
        assert_eq!(aligned_lower_bound(&b, 16), 20);
        assert_eq!(aligned_lower_bound(&b, 1), 8);
    }

    #[test]
    fn align() {
        assert_eq!(align_up(0, 256), 0);
        assert_eq!(align_up(1, 256), 256);
        assert_eq!(align_up(512, 256), 512);
        assert_eq!(align_up(7, 0), 7);
        assert_eq!(align_up(u64::MAX, 256), u64::MAX);
    }
}
