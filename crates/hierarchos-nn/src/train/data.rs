//! Training data for causal LMs: token sequences (read from files, folders or Hub datasets by `files.rs`), an
//! evaluation split, and batches drawn in a seeded order that a resumed run continues exactly.

use std::path::PathBuf;

use crate::error::{Error, Result};
use crate::sampling::SplitMix64;
use crate::tokenizer::Tokenizer;

/// The label of padding, which the loss skips.
pub use hierarchos_core::ops::loss::IGNORE_INDEX;

/// The token sequences of a training source, in file order.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenData {
    /// One training example each, at most `seq_len` tokens long.
    pub sequences: Vec<Vec<u32>>,
    /// Whether the sequences are chunks of packed text (all exactly `seq_len` long, so batches need no padding)
    /// rather than `input_ids` rows taken as they are.
    pub packed: bool,
    /// The files read, in order, so a run can log what it trained on (Hub files are their cache paths).
    pub files: Vec<PathBuf>,
}

impl TokenData {
    /// Splits off the last `ceil(fraction * n)` sequences as the evaluation set, so the split is the same on every
    /// run and machine; `fraction` is in [0, 1) and the training part must keep at least one sequence.
    pub fn split_eval(self, fraction: f64) -> Result<(TokenData, TokenData)> {
        if !(0.0..1.0).contains(&fraction) {
            return Err(Error::Invalid(format!("eval fraction {fraction} is not in [0, 1)")));
        }
        let n = self.sequences.len();
        let n_eval = (fraction * n as f64).ceil() as usize;
        if n_eval >= n {
            return Err(Error::Invalid(format!(
                "eval fraction {fraction} of {n} sequences leaves none to train on"
            )));
        }
        let mut train = self;
        let eval = TokenData {
            sequences: train.sequences.split_off(n - n_eval),
            packed: train.packed,
            files: train.files.clone(),
        };
        Ok((train, eval))
    }
}

/// Where a [`Batcher`] is: the epoch and the position in that epoch's order. Saved in checkpoints so that a
/// resumed run draws exactly the batches the interrupted one would have.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BatcherState {
    /// Completed passes over the data.
    pub epoch: u64,
    /// Sequences of this epoch's order already drawn (always less than the number of sequences).
    pub cursor: usize,
}

/// Draws batches of sequence indices: in file order, or in a fresh seeded permutation each epoch. Batches run
/// across epoch boundaries (the last batch of an epoch is completed from the start of the next one), so every
/// sequence is drawn once per epoch, and without shuffling step `k` takes indices `k*B .. k*B+B-1` modulo `n`.
#[derive(Clone, Debug)]
pub struct Batcher {
    n: usize,
    seed: u64,
    shuffle: bool,
    state: BatcherState,
    order: Vec<usize>,
}

impl Batcher {
    /// A batcher over `n` sequences at the start of epoch 0.
    pub fn new(n: usize, seed: u64, shuffle: bool) -> Result<Batcher> {
        Batcher::restore(n, seed, shuffle, BatcherState::default())
    }

    /// A batcher that continues from `state` (from [`Batcher::state`] of one with the same `n`, `seed` and
    /// `shuffle`); each epoch's order depends only on the seed and the epoch, so nothing else needs saving.
    pub fn restore(n: usize, seed: u64, shuffle: bool, state: BatcherState) -> Result<Batcher> {
        if n == 0 {
            return Err(Error::Invalid("batcher: no sequences to draw from".into()));
        }
        if state.cursor >= n {
            return Err(Error::Invalid(format!(
                "batcher state {state:?} is past the end of {n} sequences (saved for other data?)"
            )));
        }
        let order = epoch_order(n, seed, shuffle, state.epoch);
        Ok(Batcher {
            n,
            seed,
            shuffle,
            state,
            order,
        })
    }

    /// The indices of the next `batch` sequences.
    pub fn next_indices(&mut self, batch: usize) -> Vec<usize> {
        (0..batch)
            .map(|_| {
                let index = self.order[self.state.cursor];
                self.state.cursor += 1;
                if self.state.cursor == self.n {
                    self.state.epoch += 1;
                    self.state.cursor = 0;
                    self.order = epoch_order(self.n, self.seed, self.shuffle, self.state.epoch);
                }
                index
            })
            .collect()
    }

    /// Where the batcher is, for a checkpoint.
    pub fn state(&self) -> BatcherState {
        self.state.clone()
    }
}

/// The order of `epoch`: `0..n`, or a Fisher-Yates shuffle drawn from a SplitMix64 generator whose state mixes
/// the seed and the epoch (the same on every machine).
fn epoch_order(n: usize, seed: u64, shuffle: bool, epoch: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    if shuffle {
        let mixed = SplitMix64(seed).next_u64();
        let mut rng = SplitMix64(SplitMix64(mixed ^ epoch).next_u64());
        for i in (1..n).rev() {
            // Uniform in 0..=i by the high half of a 64x64-bit product (Lemire), exact in u128 everywhere.
            let j = ((rng.next_u64() as u128 * (i as u128 + 1)) >> 64) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// Token ids and labels of a batch, `[batch, len]` row-major.
#[derive(Clone, Debug, PartialEq)]
pub struct Batch {
    /// Token ids, each row padded on the right with the pad id.
    pub ids: Vec<u32>,
    /// The ids again (the model shifts them, as transformers does with `labels = input_ids`), with
    /// [`IGNORE_INDEX`] at padding so the loss skips it.
    pub labels: Vec<i32>,
    /// Rows.
    pub batch: usize,
    /// Positions per row: the longest sequence of the batch.
    pub len: usize,
}

impl Batch {
    /// Refuses a token id past the model's vocabulary, naming it: checked on the host, where the ids are, since
    /// the GPU only clamps lookups in batches too large to check there (`CHECKED_INDEX_LIMIT`).
    pub fn check_vocab(&self, vocab: usize) -> Result<()> {
        match self.ids.iter().position(|&id| id as usize >= vocab) {
            None => Ok(()),
            Some(at) => Err(Error::Invalid(format!(
                "token id {} (row {}, position {} of the batch) is past the model's vocabulary of {vocab}",
                self.ids[at],
                at / self.len,
                at % self.len
            ))),
        }
    }

    /// Tokens whose next-token loss counts: every label but the first of each row, unless skipped.
    pub fn predicted(&self) -> usize {
        self.labels
            .chunks(self.len.max(1))
            .map(|row| row.iter().skip(1).filter(|&&l| l != IGNORE_INDEX).count())
            .sum()
    }
}

/// The batch of `data`'s sequences at `indices`, padded on the right to the longest of them: with causal attention
/// no real token sees the padding after it, and the loss skips its labels, so no attention mask is needed.
/// Panics if an index is out of range.
pub fn make_batch(data: &TokenData, indices: &[usize], pad_id: u32) -> Batch {
    let rows: Vec<&[u32]> = indices.iter().map(|&i| data.sequences[i].as_slice()).collect();
    let len = rows.iter().map(|r| r.len()).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(rows.len() * len);
    let mut labels = Vec::with_capacity(rows.len() * len);
    for row in &rows {
        ids.extend_from_slice(row);
        ids.resize(ids.len() + len - row.len(), pad_id);
        labels.extend(row.iter().map(|&id| id as i32));
        labels.resize(labels.len() + len - row.len(), IGNORE_INDEX);
    }
    Batch {
        ids,
        labels,
        batch: rows.len(),
        len,
    }
}

/// The id that fills short rows: the tokenizer's pad token, else its first end-of-sequence token, else 0 (their
/// labels are skipped either way).
pub fn pad_id(tokenizer: Option<&Tokenizer>) -> u32 {
    tokenizer
        .and_then(|t| t.pad_id().or_else(|| t.eos_ids().first().copied()))
        .unwrap_or(0)
}
