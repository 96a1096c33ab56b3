//! What each training step measured, as the plots draw it and the CSV export writes it.

use serde::{Deserialize, Serialize};

/// What one training step measured (and the evaluation loss when it evaluated).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// Steps completed.
    pub step: usize,
    /// Training loss of the step.
    pub loss: Option<f64>,
    /// Held-out loss, on the steps that evaluated.
    pub eval_loss: Option<f64>,
    /// Learning rate the step ran at.
    pub lr: f64,
    /// Training throughput of the step.
    pub tokens_per_sec: f64,
    /// GPU memory held by tensors after the step.
    pub memory_mib: f64,
}

/// The points as CSV: `step,loss,eval_loss,lr,tokens_per_sec,memory_mib` (empty cells where a step has no value).
pub fn to_csv(points: &[Point]) -> String {
    let opt = |v: Option<f64>| v.map(|x| x.to_string()).unwrap_or_default();
    let mut s = String::from("step,loss,eval_loss,lr,tokens_per_sec,memory_mib\n");
    for p in points {
        s.push_str(&format!(
            "{},{},{},{},{},{}\n",
            p.step,
            opt(p.loss),
            opt(p.eval_loss),
            p.lr,
            p.tokens_per_sec,
            p.memory_mib
        ));
    }
    s
}

/// Exponential moving average of `values` with weight `smoothing` on the past (0: the values themselves), with
/// the bias correction TensorBoard applies so that the curve starts at the first value.
pub fn smooth(values: &[[f64; 2]], smoothing: f64) -> Vec<[f64; 2]> {
    let mut avg = 0.0;
    let mut weight = 0.0;
    values
        .iter()
        .map(|&[x, y]| {
            avg = smoothing * avg + (1.0 - smoothing) * y;
            weight = smoothing * weight + (1.0 - smoothing);
            [x, if weight > 0.0 { avg / weight } else { y }]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smoothing_starts_at_the_first_value_and_follows_a_constant() {
        let v = [[1.0, 4.0], [2.0, 4.0], [3.0, 4.0]];
        assert_eq!(smooth(&v, 0.9), v.to_vec());
        let v = [[1.0, 0.0], [2.0, 10.0]];
        let s = smooth(&v, 0.5);
        assert_eq!(s[0], [1.0, 0.0]);
        assert!((s[1][1] - 10.0 * 0.5 / 0.75).abs() < 1e-12);
        assert_eq!(smooth(&v, 0.0), v.to_vec());
    }

    #[test]
    fn csv_leaves_missing_values_empty() {
        let p = Point {
            step: 3,
            loss: Some(2.5),
            eval_loss: None,
            lr: 0.001,
            tokens_per_sec: 100.0,
            memory_mib: 1.5,
        };
        assert_eq!(
            to_csv(&[p]),
            "step,loss,eval_loss,lr,tokens_per_sec,memory_mib\n3,2.5,,0.001,100,1.5\n"
        );
    }
}
