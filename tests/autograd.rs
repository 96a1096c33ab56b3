//! Tape behaviour: accumulation, detach, no_grad, views in the graph, freeing, and misuse errors.

mod common;
use common::*;
use hierarchos::core::{DType, Tensor, no_grad};

#[test]
fn gradients_accumulate_across_backward_calls() {
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, -2.0, 3.0], &[3], &d)
        .unwrap()
        .requires_grad_();
    for _ in 0..2 {
        x.mul(&x).unwrap().sum_all().unwrap().backward().unwrap();
    }
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![4.0, -8.0, 12.0]);
    x.zero_grad();
    assert!(x.grad().is_none());
}

/// Each leaf's gradient is its own buffer, also where one op hands the same gradient to two leaves (an add):
/// writing into one leaves the other as it was. Integer tensors take no gradient (a cast to float gave back a
/// truncated one).
#[test]
fn leaves_own_their_gradients() {
    let d = dev();
    let p = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap().requires_grad_();
    let q = Tensor::from_slice(&[3.0f32, 4.0], &[2], &d).unwrap().requires_grad_();
    p.add(&q)
        .unwrap()
        .mul_scalar(2.0)
        .unwrap()
        .sum_all()
        .unwrap()
        .backward()
        .unwrap();
    p.grad()
        .unwrap()
        .assign(&Tensor::zeros(&[2], DType::F32, &d).unwrap())
        .unwrap();
    assert_eq!(q.grad().unwrap().to_vec::<f32>().unwrap(), [2.0, 2.0]);
    let ids = Tensor::from_slice(&[1i32, 2, 3], &[3], &d).unwrap().requires_grad_();
    assert!(!ids.requires_grad());
    let loss = ids
        .to_dtype(DType::F32)
        .unwrap()
        .mul_scalar(1.5)
        .unwrap()
        .sum_all()
        .unwrap();
    assert!(loss.backward().is_err(), "nothing requires a gradient");
    assert!(ids.grad().is_none());
}

#[test]
fn shared_subexpressions_sum_their_gradients() {
    let d = dev();
    let x = Tensor::from_slice(&[2.0f32], &[1], &d).unwrap().requires_grad_();
    let y = x.mul_scalar(3.0).unwrap();
    // z = y*y + y: dz/dx = (2y + 1) * 3 = 39 at x = 2
    let z = y.mul(&y).unwrap().add(&y).unwrap().sum_all().unwrap();
    z.backward().unwrap();
    assert_eq!(x.grad().unwrap().to_vec::<f32>().unwrap(), vec![39.0]);
}

#[test]
fn detach_and_no_grad_stop_the_tape() {
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap().requires_grad_();
    assert!(!x.detach().requires_grad());
    let y = no_grad(|| x.exp().unwrap());
    assert!(!y.requires_grad());
    let z = x.mul(&x.detach()).unwrap().sum_all().unwrap();
    z.backward().unwrap();
    assert_eq!(
        x.grad().unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, 2.0],
        "only the tracked factor contributes"
    );
}

#[test]
fn views_carry_gradients() {
    let mut rng = Rng::new("views_grad");
    let x = rng.vec(24, -1.0, 1.0);
    gradcheck(
        "reshape/permute/narrow/broadcast",
        &mut rng,
        &[(x, vec![2, 3, 4])],
        |t| {
            let v = t[0].permute(&[2, 0, 1])?.narrow(0, 1, 2)?.reshape(&[2, 6])?;
            let b = v.unsqueeze(0)?.broadcast_to(&[3, 2, 6])?;
            b.mul(&b)?.contiguous()
        },
    );
    let y = rng.vec(6, -1.0, 1.0);
    gradcheck(
        "cat and stack",
        &mut rng,
        &[(y.clone(), vec![2, 3]), (y, vec![2, 3])],
        |t| {
            let c = Tensor::cat(&[t[0].clone(), t[1].mul_scalar(2.0)?, t[0].clone()], 1)?;
            Tensor::stack(&[c.clone(), c.exp()?], 0)
        },
    );
}

#[test]
fn second_backward_through_a_freed_graph_is_an_error() {
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap().requires_grad_();
    let loss = x.exp().unwrap().sum_all().unwrap();
    loss.backward().unwrap();
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("second time"), "{err}");
}

/// A tensor an op recorded, written in place before the backward ran: the gradient would read the new values
/// (exp's rule reads its output), so the backward refuses, naming the op, as torch does.
#[test]
fn writing_a_recorded_tensor_before_backward_is_an_error() {
    let d = dev();
    let x = Tensor::from_slice(&[0.0f32, 1.0], &[2], &d).unwrap().requires_grad_();
    let y = x.exp().unwrap();
    let loss = y.sum_all().unwrap();
    no_grad(|| y.assign(&Tensor::full(&[2], 100.0, DType::F32, &d).unwrap())).unwrap();
    let err = loss.backward().unwrap_err().to_string();
    assert!(err.contains("written in place"), "{err}");
    // Written before the op ran, it is what the op read: nothing to refuse.
    let z = x.mul_scalar(1.0).unwrap();
    no_grad(|| z.assign(&Tensor::full(&[2], 2.0, DType::F32, &d).unwrap())).unwrap();
    z.exp().unwrap().sum_all().unwrap().backward().unwrap();
    assert_close(
        "d exp(z)",
        &x.grad().unwrap().to_vec::<f32>().unwrap(),
        &[2f64.exp(); 2],
        1e-6,
        0.0,
    );
}

#[test]
fn misuse_is_reported() {
    let d = dev();
    let x = Tensor::from_slice(&[1.0f32, 2.0], &[2], &d).unwrap().requires_grad_();
    assert!(x.exp().unwrap().backward().is_err(), "backward from a non-scalar");
    let c = Tensor::from_slice(&[1.0f32], &[1], &d).unwrap();
    assert!(c.backward().is_err(), "nothing requires grad");
    let ids = Tensor::zeros(&[1], DType::U32, &d).unwrap();
    assert!(ids.backward().is_err(), "integer loss");
}

#[test]
fn intermediate_buffers_are_released_after_backward() {
    // A device of its own, so that tests running in parallel do not disturb the byte counts.
    let d = own_dev();
    let x = Tensor::from_slice(&vec![0.5f32; 4096], &[4096], &d)
        .unwrap()
        .requires_grad_();
    d.synchronize().unwrap();
    let before = d.memory().live_bytes;
    {
        let loss = x.exp().unwrap().tanh().unwrap().sigmoid().unwrap().sum_all().unwrap();
        loss.backward().unwrap();
    }
    x.zero_grad();
    d.synchronize().unwrap();
    assert!(
        d.memory().live_bytes <= before,
        "live {} > {before}",
        d.memory().live_bytes
    );
    assert!(d.memory().peak_bytes >= before);
}

#[test]
fn the_graph_keeps_only_what_gradients_read() {
    // Adds, subtractions, scaling and a frozen weight's product need none of their inputs for the backward:
    // once the caller drops an intermediate, its buffer goes (LoRA on a frozen model would otherwise hold every
    // layer's outputs twice). A product or a `mul` with a frozen operand keeps that operand (which the gradient
    // reads, and which is alive anyway) but not the other one.
    let d = own_dev();
    let n = 1 << 16;
    let x = Tensor::from_slice(&vec![0.5f32; n], &[256, 256], &d)
        .unwrap()
        .requires_grad_();
    let w = Tensor::from_slice(&vec![0.25f32; n], &[256, 256], &d).unwrap();
    d.synchronize().unwrap();
    let base = d.memory().live_bytes;
    let block = 4 * n as u64;
    let y = {
        let doubled = x.mul_scalar(2.0).unwrap();
        let shifted = doubled.add_scalar(1.0).unwrap();
        let summed = shifted.add(&doubled).unwrap().mul(&w).unwrap();
        let diff = summed.sub(&x).unwrap();
        diff.matmul(&w).unwrap()
    };
    d.synchronize().unwrap();
    // Alive: y only (x and w are counted in `base`).
    assert_eq!(d.memory().live_bytes, base + block, "intermediates kept by the graph");
    y.sum_all().unwrap().backward().unwrap();
    assert!(x.grad().is_some());
}

/// Gradients of narrowed views of a recorded tensor: slices that tile it, leave gaps, overlap, repeat or cut
/// along another dimension, together with a use of the whole, sum to what the padded slices would.
#[test]
fn narrowed_views_gather_their_gradients() {
    let d = dev();
    let mut rng = Rng::new("narrowed_views_gather_their_gradients");
    let (rows, cols) = (4, 7);
    let x = Tensor::from_slice(&rng.vec(rows * cols, -1.0, 1.0), &[rows, cols], &d)
        .unwrap()
        .requires_grad_();
    let cuts: [(usize, usize, usize); 7] = [
        (1, 0, 2),
        (1, 2, 3),
        (1, 5, 2),
        (1, 3, 2),
        (1, 0, 2),
        (0, 1, 2),
        (1, 6, 1),
    ];
    for used in [3, cuts.len()] {
        x.zero_grad();
        let y = x.mul_scalar(2.0).unwrap();
        let whole = rng.vec(rows * cols, -1.0, 1.0);
        let mut expected: Vec<f64> = whole.iter().map(|&w| 2.0 * w as f64).collect();
        let mut loss = y
            .mul(&Tensor::from_slice(&whole, &[rows, cols], &d).unwrap())
            .unwrap()
            .sum_all()
            .unwrap();
        for &(dim, start, len) in &cuts[..used] {
            let part = y.narrow(dim as isize, start, len).unwrap();
            let w = rng.vec(part.numel(), -1.0, 1.0);
            for (i, &wi) in w.iter().enumerate() {
                let (r, c) = (i / part.shape()[1], i % part.shape()[1]);
                let (r, c) = if dim == 0 { (r + start, c) } else { (r, c + start) };
                expected[r * cols + c] += 2.0 * wi as f64;
            }
            let term = part.mul(&Tensor::from_slice(&w, part.shape(), &d).unwrap()).unwrap();
            loss = loss.add(&term.sum_all().unwrap()).unwrap();
        }
        loss.backward().unwrap();
        let got = x.grad().unwrap().to_vec::<f32>().unwrap();
        assert_close("narrowed views", &got, &expected, 1e-5, 1e-5);
    }
}
