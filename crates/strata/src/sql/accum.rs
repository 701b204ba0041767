//! Sums and counts of a batch's values per group when the groups are few: each group has
//! [`LANES`] partial sums and row `k` adds into lane `k % LANES` of its group. Adding each
//! row into its group's state makes the rows of one group a chain of additions through
//! memory, each waiting for the one before; with lanes, consecutive rows never wait on each
//! other, and the states are merged once per group and batch. The partial sums are added
//! together at the end: an `f64` sum is associated differently than row by row.

/// Groups at most that [`Lanes`] sums for.
pub const FEW: usize = 64;

/// Partial sums per group.
const LANES: usize = 8;

/// Per-group partial sums and counts, reused from batch to batch.
#[derive(Default)]
pub struct Lanes {
    f: Vec<f64>,
    i: Vec<i128>,
    n: Vec<i64>,
    /// Rows per group of the batch (see [`count_groups`](Self::count_groups)).
    rows: Vec<i64>,
}

/// A batch's group ids: `Some(ids)`, row `k` in group `ids[k]`, or `None`, all rows in
/// group 0.
pub type Gids<'a> = Option<&'a [u32]>;

impl Lanes {
    /// Counts the rows of each of the `groups` groups (every id is below `groups`) among
    /// the first `len`; then [`rows`](Self::rows) gives them. First for every batch.
    pub fn count_groups(&mut self, gids: Gids<'_>, len: usize, groups: usize) {
        zeroed(&mut self.rows, groups.max(1), 0);
        match gids {
            None => self.rows[0] = len as i64,
            Some(ids) => {
                zeroed(&mut self.n, groups * LANES, 0);
                for (k, &g) in ids[..len].iter().enumerate() {
                    self.n[g as usize * LANES + k % LANES] += 1;
                }
                for (g, r) in self.rows.iter_mut().enumerate() {
                    *r = total(&self.n, g);
                }
            }
        }
    }

    /// The rows of group `g` counted by [`count_groups`](Self::count_groups).
    pub fn rows(&self, g: usize) -> i64 {
        self.rows[g]
    }

    /// Per group, the rows whose value is not NULL (`null[k]`; none given: all rows), in
    /// `n`'s lanes when a NULL vector is given.
    fn count_values(&mut self, gids: Gids<'_>, null: Option<&[bool]>, groups: usize) {
        if let Some(nu) = null {
            zeroed(&mut self.n, groups.max(1) * LANES, 0);
            for (k, &u) in nu.iter().enumerate() {
                self.n[gid(gids, k) * LANES + k % LANES] += i64::from(!u);
            }
        }
    }

    /// The count of group `g` by [`count_values`](Self::count_values).
    fn values(&self, null: Option<&[bool]>, g: usize) -> i64 {
        match null {
            None => self.rows[g],
            Some(_) => total(&self.n, g),
        }
    }

    /// Calls `each(group, count)` for each group with rows whose value is not NULL
    /// (`null[k]`, if given), `count` of them.
    pub fn count<E>(&mut self, gids: Gids<'_>, null: Option<&[bool]>, groups: usize, mut each: impl FnMut(usize, i64) -> Result<(), E>) -> Result<(), E> {
        self.count_values(gids, null, groups);
        for g in 0..groups.max(1) {
            match self.values(null, g) {
                0 => {}
                c => each(g, c)?,
            }
        }
        Ok(())
    }

    /// Calls `each(group, sum, count)` for each group with values of `v` that are not NULL
    /// (`null[k]`, if given): their sum and how many there are.
    // Not inlined, as in the stop-28 build: inlined into `Prog::merge_few` (since the
    // streamed runs added a caller of `merge_rows`) TPC-H Q1 measured 10-25 % more CPU.
    #[inline(never)]
    pub fn sum_f<E>(
        &mut self,
        v: &[f64],
        gids: Gids<'_>,
        null: Option<&[bool]>,
        groups: usize,
        mut each: impl FnMut(usize, f64, i64) -> Result<(), E>,
    ) -> Result<(), E> {
        self.count_values(gids, null, groups);
        // -0.0 is the sum of nothing: it changes no sum it is added to, not even -0.0.
        zeroed(&mut self.f, groups.max(1) * LANES, -0.0);
        match (gids, null) {
            (None, None) => {
                // One group: the lanes are the chunks' positions (a loop that vectorizes).
                let whole = v.len() / LANES * LANES;
                for c in v[..whole].chunks_exact(LANES) {
                    self.f.iter_mut().zip(c).for_each(|(a, &x)| *a += x);
                }
                for (k, &x) in v.iter().enumerate().skip(whole) {
                    self.f[k % LANES] += x;
                }
            }
            (Some(ids), None) => {
                for (k, (&x, &g)) in v.iter().zip(ids).enumerate() {
                    self.f[g as usize * LANES + k % LANES] += x;
                }
            }
            (_, Some(nu)) => {
                for (k, (&x, &u)) in v.iter().zip(nu).enumerate() {
                    if !u {
                        self.f[gid(gids, k) * LANES + k % LANES] += x;
                    }
                }
            }
        }
        for g in 0..groups.max(1) {
            match self.values(null, g) {
                0 => {}
                c => each(g, self.f[g * LANES..(g + 1) * LANES].iter().fold(-0.0, |s, &a| s + a), c)?,
            }
        }
        Ok(())
    }

    /// [`sum_f`](Self::sum_f) for `i64` values, summed exactly.
    pub fn sum_i<E>(
        &mut self,
        v: &[i64],
        gids: Gids<'_>,
        null: Option<&[bool]>,
        groups: usize,
        mut each: impl FnMut(usize, i128, i64) -> Result<(), E>,
    ) -> Result<(), E> {
        self.count_values(gids, null, groups);
        zeroed(&mut self.i, groups.max(1) * LANES, 0);
        for (k, &x) in v.iter().enumerate() {
            if null.is_none_or(|nu| !nu[k]) {
                self.i[gid(gids, k) * LANES + k % LANES] += x as i128;
            }
        }
        for g in 0..groups.max(1) {
            match self.values(null, g) {
                0 => {}
                c => each(g, total(&self.i, g), c)?,
            }
        }
        Ok(())
    }
}

/// `v` as `len` copies of `zero`, reusing its memory.
fn zeroed<T: Copy>(v: &mut Vec<T>, len: usize, zero: T) {
    v.clear();
    v.resize(len, zero);
}

/// The sum of group `g`'s lanes in `v`.
fn total<T: Copy + std::iter::Sum>(v: &[T], g: usize) -> T {
    v[g * LANES..(g + 1) * LANES].iter().copied().sum()
}

#[inline(always)]
fn gid(gids: Gids<'_>, k: usize) -> usize {
    gids.map_or(0, |ids| ids[k] as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Group sums and counts agree with a row-by-row reference, for groups given or not,
    /// NULLs given or not, and lengths around the lane width; groups without a value are
    /// not reported.
    #[test]
    fn group_sums_agree_with_row_by_row_sums() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut lanes = Lanes::default();
        for len in [0usize, 1, 7, 8, 9, 16, 63, 100] {
            let vf: Vec<f64> = (0..len).map(|_| (next() % 1000) as f64 / 8.0 - 60.0).collect();
            let vi: Vec<i64> = (0..len).map(|_| (next() as i64) >> 2).collect();
            // Group 2 of 4 has no row; group 3 only some.
            let ids: Vec<u32> = (0..len).map(|_| [0, 1, 3][(next() % 3) as usize]).collect();
            let nul: Vec<bool> = (0..len).map(|_| next() % 4 == 0).collect();
            for (gids, null) in [(None, None), (Some(&ids[..]), None), (None, Some(&nul[..])), (Some(&ids[..]), Some(&nul[..]))] {
                let groups = if gids.is_some() { 4 } else { 1 };
                let taken = |g: usize| -> Vec<usize> { (0..len).filter(|&k| gids.is_none_or(|i| i[k] as usize == g) && null.is_none_or(|n| !n[k])).collect() };
                lanes.count_groups(gids, len, groups);
                for g in 0..groups {
                    assert_eq!(lanes.rows(g), (0..len).filter(|&k| gids.is_none_or(|i| i[k] as usize == g)).count() as i64);
                }
                let mut seen = Vec::new();
                lanes
                    .sum_f(&vf, gids, null, groups, |g, s, c| {
                        let t = taken(g);
                        // Eighths of small integers: every order of addition gives the same sum.
                        assert_eq!(s, t.iter().map(|&k| vf[k]).sum::<f64>(), "len {len} group {g}");
                        assert_eq!(c, t.len() as i64);
                        seen.push(g);
                        Ok::<_, ()>(())
                    })
                    .unwrap();
                assert_eq!(seen, (0..groups).filter(|&g| !taken(g).is_empty()).collect::<Vec<_>>());
                seen.clear();
                lanes
                    .sum_i(&vi, gids, null, groups, |g, s, c| {
                        let t = taken(g);
                        assert_eq!(s, t.iter().map(|&k| vi[k] as i128).sum::<i128>());
                        assert_eq!(c, t.len() as i64);
                        seen.push(g);
                        Ok::<_, ()>(())
                    })
                    .unwrap();
                assert_eq!(seen, (0..groups).filter(|&g| !taken(g).is_empty()).collect::<Vec<_>>());
                let mut counted = vec![0; groups];
                lanes
                    .count(gids, null, groups, |g, c| {
                        counted[g] = c;
                        Ok::<_, ()>(())
                    })
                    .unwrap();
                assert_eq!(counted, (0..groups).map(|g| taken(g).len() as i64).collect::<Vec<_>>());
            }
        }
    }
}
