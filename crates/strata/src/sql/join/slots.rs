//! The joined row of a hash join, filled in place: the columns of each side that are
//! used above the join (or by its residual) are the only ones its records carry, and a
//! record is decoded straight into those columns' slots of one reused row (strings reuse
//! their buffers). The other columns stay NULL, as a pruned scan leaves them (see
//! [`super::super::scan`]).

use super::super::rows::{assign, corrupt, decode_value_into, encode_value};
use crate::access::table::Value;
use crate::error::Result;

/// The output row of a join and where each side's kept columns go in it.
#[derive(Clone)]
pub(crate) struct Joined {
    /// Left columns, then right (for semi and anti joins too: their residual reads both).
    row: Vec<Value>,
    lw: usize,
    /// Offsets of the probe side's and the build side's columns in `row`.
    po: usize,
    bo: usize,
    /// The kept columns of each side, as indexes into that side's rows.
    pcols: Vec<usize>,
    bcols: Vec<usize>,
}

impl Joined {
    /// `keep`: per column of `row` (left then right), whether it is read above the join or
    /// by its residual; empty: all are.
    pub(super) fn new(lw: usize, rw: usize, keep: &[bool], build_left: bool) -> Joined {
        let kept = |from: usize, n: usize| -> Vec<usize> { (0..n).filter(|i| keep.get(from + i).copied().unwrap_or(keep.is_empty())).collect() };
        let (lcols, rcols) = (kept(0, lw), kept(lw, rw));
        let (po, bo, pcols, bcols) = if build_left { (lw, 0, rcols, lcols) } else { (0, lw, lcols, rcols) };
        Joined { row: vec![Value::Null; lw + rw], lw, po, bo, pcols, bcols }
    }

    /// Whether a build record carries no column.
    pub(super) fn build_empty(&self) -> bool {
        self.bcols.is_empty()
    }

    fn encode(cols: &[usize], row: &[Value], out: &mut Vec<u8>) -> Result<()> {
        for &c in cols {
            encode_value(row.get(c).ok_or_else(|| corrupt("join row narrower than its plan"))?, out);
        }
        Ok(())
    }

    /// Appends the kept columns of a build row to `out`.
    pub(super) fn encode_build(&self, row: &[Value], out: &mut Vec<u8>) -> Result<()> {
        Self::encode(&self.bcols, row, out)
    }

    /// Appends the kept columns of a probe row to `out`.
    pub(super) fn encode_probe(&self, row: &[Value], out: &mut Vec<u8>) -> Result<()> {
        Self::encode(&self.pcols, row, out)
    }

    fn decode(row: &mut [Value], at: usize, cols: &[usize], mut b: &[u8]) -> Result<()> {
        for &c in cols {
            decode_value_into(row.get_mut(at + c).ok_or_else(|| corrupt("join column"))?, &mut b)?;
        }
        if !b.is_empty() {
            return Err(corrupt("join record longer than its columns"));
        }
        Ok(())
    }

    /// Puts a build record (see [`encode_build`](Self::encode_build)) into its slots.
    pub(super) fn decode_build(&mut self, b: &[u8]) -> Result<()> {
        Self::decode(&mut self.row, self.bo, &self.bcols, b)
    }

    /// Puts a probe record (see [`encode_probe`](Self::encode_probe)) into its slots.
    pub(super) fn decode_probe(&mut self, b: &[u8]) -> Result<()> {
        Self::decode(&mut self.row, self.po, &self.pcols, b)
    }

    /// Copies the kept columns of a probe row into their slots.
    pub(super) fn load_probe(&mut self, prow: &[Value]) -> Result<()> {
        for &c in &self.pcols {
            let v = prow.get(c).ok_or_else(|| corrupt("join row narrower than its plan"))?;
            assign(&mut self.row[self.po + c], v);
        }
        Ok(())
    }

    /// The kept columns of the probe side (indexes into its rows).
    pub(super) fn probe_cols(&self) -> &[usize] {
        &self.pcols
    }

    /// Decodes the kept columns of row `i` of a batch of the probe scan into their slots.
    pub(super) fn load_probe_leaf(&mut self, b: &crate::sql::scan::Batch<'_>, i: usize) -> Result<()> {
        b.decode(i, &self.pcols, &mut self.row[self.po..])
    }

    /// The build side's columns set to NULL (a LEFT join's row without a match).
    pub(super) fn null_build(&mut self) {
        for &c in &self.bcols {
            self.row[self.bo + c] = Value::Null;
        }
    }

    /// The whole row: left columns, then right.
    pub(super) fn all(&self) -> &[Value] {
        &self.row
    }

    /// The left columns.
    pub(super) fn left(&self) -> &[Value] {
        &self.row[..self.lw]
    }
}
