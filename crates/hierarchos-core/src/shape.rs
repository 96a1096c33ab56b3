//! Shapes, strides and the view arithmetic that lets reshape, permute, narrow and expand avoid copies.

use crate::error::{Error, Result};

/// The most dimensions a tensor may have; kernels carry this many shape and stride slots.
pub const MAX_DIMS: usize = 8;

/// Where the elements of a tensor sit in its buffer: element `(i0, i1, ...)` is at
/// `offset + i0 * strides[0] + i1 * strides[1] + ...` (in elements). A stride of 0 is a broadcast dimension.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Size of each dimension.
    pub shape: Vec<usize>,
    /// Step in elements for each dimension.
    pub strides: Vec<usize>,
    /// Element offset of the first element.
    pub offset: usize,
}

/// Row-major strides of a contiguous tensor of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for d in (0..shape.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * shape[d + 1];
    }
    s
}

/// Number of elements of `shape`.
pub fn numel(shape: &[usize]) -> usize {
    shape.iter().product()
}

/// [`numel`], or `None` where the product passes `usize` (shapes asked for, not yet checked).
pub fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
}

/// The shape two shapes broadcast to, NumPy style (aligned at the right, size 1 stretches).
pub fn broadcast_shapes(op: &'static str, a: &[usize], b: &[usize]) -> Result<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = vec![0; n];
    for i in 0..n {
        let da = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let db = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (da, db) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: a.to_vec(),
                    rhs: b.to_vec(),
                });
            }
        };
    }
    Ok(out)
}

/// Resolves a possibly negative dimension index against `rank`.
pub fn resolve_dim(op: &'static str, dim: isize, rank: usize) -> Result<usize> {
    let d = if dim < 0 { dim + rank as isize } else { dim };
    if d < 0 || d as usize >= rank {
        return Err(Error::IndexOutOfRange {
            op,
            index: dim as i64,
            size: rank,
        });
    }
    Ok(d as usize)
}

impl Layout {
    /// A contiguous layout of `shape` at offset 0.
    pub fn contiguous(shape: &[usize]) -> Self {
        Layout {
            shape: shape.to_vec(),
            strides: contiguous_strides(shape),
            offset: 0,
        }
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        numel(&self.shape)
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// True when elements are stored densely in row-major order (offset may be non-zero).
    pub fn is_contiguous(&self) -> bool {
        let mut expected = 1;
        for d in (0..self.shape.len()).rev() {
            if self.shape[d] != 1 && self.strides[d] != expected {
                return false;
            }
            expected *= self.shape[d];
        }
        true
    }

    /// True when the last dimension has unit stride and every row starts on a multiple of 4 elements (offset and
    /// other strides multiples of 4): kernels can then read the rows as vectors of four.
    pub fn rows_of_vec4s(&self) -> bool {
        let r = self.rank();
        r > 0
            && self.strides[r - 1] == 1
            && self.offset.is_multiple_of(4)
            && self.strides[..r - 1].iter().all(|s| s.is_multiple_of(4))
    }

    /// The distance between rows when the last dimension has unit stride and the leading ones fold into one row
    /// index: a dense tensor, or a column block of a wider one as `narrow` along the last dimension leaves it.
    /// Kernels then address (row, column) as `offset + row * stride + column`, one division per element instead
    /// of one per dimension. A tensor of rank 1 is one row.
    pub fn row_stride(&self) -> Option<usize> {
        let rank = self.rank();
        if rank == 0 || self.strides[rank - 1] != 1 {
            return None;
        }
        if rank == 1 {
            return Some(self.shape[0]);
        }
        let mut step = self.strides[rank - 2];
        for k in (0..rank - 2).rev() {
            step *= self.shape[k + 1];
            if self.shape[k] != 1 && self.strides[k] != step {
                return None;
            }
        }
        Some(self.strides[rank - 2])
    }

    /// The offset and row stride in quads (four elements) when the rows fold into one row index
    /// ([`Layout::row_stride`]) and each starts on a quad ([`Layout::rows_of_vec4s`]): how kernels that read f32
    /// rows as 128-bit vectors address them. None otherwise.
    pub fn quad_rows(&self) -> Option<(usize, usize)> {
        let stride = self.row_stride()?;
        (self.rows_of_vec4s() && stride.is_multiple_of(4)).then_some((self.offset / 4, stride / 4))
    }

    /// One past the largest element index this layout touches (0 for an empty tensor).
    pub fn span_end(&self) -> usize {
        if self.numel() == 0 {
            return 0;
        }
        self.offset
            + self
                .shape
                .iter()
                .zip(&self.strides)
                .map(|(&n, &s)| (n - 1) * s)
                .sum::<usize>()
            + 1
    }

    /// This layout broadcast to `shape` (stride 0 on stretched dimensions).
    pub fn broadcast_to(&self, op: &'static str, shape: &[usize]) -> Result<Layout> {
        if shape.len() < self.rank() {
            return Err(Error::ShapeMismatch {
                op,
                lhs: self.shape.clone(),
                rhs: shape.to_vec(),
            });
        }
        let lead = shape.len() - self.rank();
        let mut strides = vec![0; shape.len()];
        for (i, &n) in shape.iter().enumerate() {
            if i < lead {
                continue;
            }
            let (m, s) = (self.shape[i - lead], self.strides[i - lead]);
            strides[i] = if m == n {
                s
            } else if m == 1 {
                0
            } else {
                return Err(Error::ShapeMismatch {
                    op,
                    lhs: self.shape.clone(),
                    rhs: shape.to_vec(),
                });
            };
        }
        Ok(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }

    /// Dimensions reordered by `perm`.
    pub fn permute(&self, perm: &[usize]) -> Result<Layout> {
        let mut seen = vec![false; self.rank()];
        if perm.len() != self.rank()
            || perm
                .iter()
                .any(|&p| p >= self.rank() || std::mem::replace(&mut seen[p], true))
        {
            return Err(Error::Invalid {
                op: "permute",
                message: format!("{perm:?} is not a permutation of {} dimensions", self.rank()),
            });
        }
        Ok(Layout {
            shape: perm.iter().map(|&p| self.shape[p]).collect(),
            strides: perm.iter().map(|&p| self.strides[p]).collect(),
            offset: self.offset,
        })
    }

    /// This layout read with the larger `shape` and moved `by` steps along `dim`, so that a kernel's coordinate c
    /// there reads c + by here: how one kernel reads an input at an offset from its own coordinates (`cat`'s
    /// inputs, the gated gradient's halves). The offset wraps in u32, as the kernels' address arithmetic does.
    pub(crate) fn shifted(&self, shape: &[usize], dim: usize, by: isize) -> Layout {
        Layout {
            shape: shape.to_vec(),
            strides: self.strides.clone(),
            offset: self
                .offset
                .wrapping_add_signed(by.wrapping_mul(self.strides[dim] as isize))
                & 0xffff_ffff,
        }
    }

    /// Elements `start..start + len` along `dim`.
    pub fn narrow(&self, dim: usize, start: usize, len: usize) -> Result<Layout> {
        if start.checked_add(len).is_none_or(|end| end > self.shape[dim]) {
            return Err(Error::IndexOutOfRange {
                op: "narrow",
                index: i64::try_from(start.saturating_add(len)).unwrap_or(i64::MAX),
                size: self.shape[dim],
            });
        }
        let mut l = self.clone();
        l.shape[dim] = len;
        if len > 0 {
            l.offset += start * self.strides[dim];
        }
        Ok(l)
    }

    /// The same elements seen with `shape`, without a copy, when the strides allow it (`None` otherwise).
    /// Dimensions of the old shape are grouped into runs that are contiguous among themselves; each run must be
    /// covered exactly by consecutive new dimensions.
    pub fn reshape(&self, shape: &[usize]) -> Option<Layout> {
        if numel(shape) != self.numel() {
            return None;
        }
        if self.numel() == 0 || self.is_contiguous() {
            return Some(Layout {
                shape: shape.to_vec(),
                strides: contiguous_strides(shape),
                offset: self.offset,
            });
        }
        let (old, old_strides) = (&self.shape, &self.strides);
        let mut strides = vec![0; shape.len()];
        let mut view_d = shape.len() as isize - 1;
        let mut base_stride = *old_strides.last()?;
        let (mut tensor_numel, mut view_numel) = (1, 1);
        for tensor_d in (0..old.len()).rev() {
            tensor_numel *= old[tensor_d];
            let run_ends =
                tensor_d == 0 || (old[tensor_d - 1] != 1 && old_strides[tensor_d - 1] != tensor_numel * base_stride);
            if run_ends {
                while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                    strides[view_d as usize] = view_numel * base_stride;
                    view_numel *= shape[view_d as usize];
                    view_d -= 1;
                }
                if view_numel != tensor_numel {
                    return None;
                }
                if tensor_d > 0 {
                    base_stride = old_strides[tensor_d - 1];
                    tensor_numel = 1;
                    view_numel = 1;
                }
            }
        }
        if view_d != -1 {
            return None;
        }
        Some(Layout {
            shape: shape.to_vec(),
            strides,
            offset: self.offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offsets(l: &Layout) -> Vec<usize> {
        let mut out = Vec::new();
        let n = l.numel();
        for i in 0..n {
            let mut rem = i;
            let mut off = l.offset;
            for d in (0..l.rank()).rev() {
                off += (rem % l.shape[d]) * l.strides[d];
                rem /= l.shape[d];
            }
            out.push(off);
        }
        out
    }

    #[test]
    fn broadcast_rules() {
        assert_eq!(broadcast_shapes("t", &[3, 1, 5], &[4, 1]).unwrap(), vec![3, 4, 5]);
        assert_eq!(broadcast_shapes("t", &[], &[2]).unwrap(), vec![2]);
        assert!(broadcast_shapes("t", &[3], &[4]).is_err());
    }

    #[test]
    fn reshape_of_views_keeps_element_order() {
        let base = Layout::contiguous(&[4, 6]);
        let t = base.permute(&[1, 0]).unwrap();
        assert!(
            t.reshape(&[24]).is_none(),
            "transposed data cannot be flattened without a copy"
        );
        let n = base.narrow(1, 1, 4).unwrap();
        let r = n.reshape(&[4, 2, 2]).expect("splitting a dim is a view");
        assert_eq!(offsets(&r), offsets(&n));
        let p = Layout::contiguous(&[2, 3, 4]).permute(&[0, 2, 1]).unwrap();
        let r = p.reshape(&[2, 4, 3, 1]).unwrap();
        assert_eq!(offsets(&r), offsets(&p));
        let r = p
            .reshape(&[2, 2, 2, 3])
            .expect("splitting the unit-stride dim is a view");
        assert_eq!(offsets(&r), offsets(&p));
        assert!(p.reshape(&[8, 3]).is_none(), "dims of strides 12 and 1 do not merge");
        assert!(p.reshape(&[2, 12]).is_none());
    }
}
