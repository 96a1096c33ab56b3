//! Creation, views without copies, in-place assignment and readback.

mod common;
use common::*;
use hierarchos::core::{DType, Tensor};

#[test]
fn creation_functions() {
    let d = dev();
    assert_eq!(
        Tensor::zeros(&[2, 3], DType::F32, &d).unwrap().to_vec::<f32>().unwrap(),
        vec![0.0; 6]
    );
    assert_eq!(
        Tensor::ones(&[3], DType::I32, &d).unwrap().to_vec::<i32>().unwrap(),
        vec![1; 3]
    );
    let f = Tensor::full(&[5], -2.5, DType::BF16, &d).unwrap();
    assert_eq!(f.to_f32_vec().unwrap(), vec![-2.5; 5]);
    assert_eq!(
        Tensor::arange(0.0, 5.0, 1.0, DType::U32, &d)
            .unwrap()
            .to_vec::<u32>()
            .unwrap(),
        vec![0, 1, 2, 3, 4]
    );
    assert_eq!(
        Tensor::arange(1.0, -1.0, -0.5, DType::F32, &d)
            .unwrap()
            .to_vec::<f32>()
            .unwrap(),
        vec![1.0, 0.5, 0.0, -0.5]
    );
    assert_eq!(Tensor::arange(3.0, 3.0, 1.0, DType::F32, &d).unwrap().numel(), 0);
    assert!(Tensor::arange(0.0, 1.0, 0.0, DType::F32, &d).is_err());
    let h: Vec<half::f16> = [1.0f32, -0.5, 3.0].iter().map(|&v| half::f16::from_f32(v)).collect();
    let t = Tensor::from_slice(&h, &[3], &d).unwrap();
    assert_eq!(t.dtype(), DType::F16);
    assert_eq!(t.to_vec::<half::f16>().unwrap(), h);
    assert!(t.to_vec::<f32>().is_err(), "readback in another dtype is refused");
    let s = Tensor::from_slice(&[4.5f32], &[], &d).unwrap();
    assert_eq!((s.rank(), s.numel(), s.item().unwrap()), (0, 1, 4.5));
}

#[test]
fn views_share_storage_and_read_correctly() {
    let d = dev();
    let data: Vec<f32> = (0..24).map(|v| v as f32).collect();
    let t = Tensor::from_slice(&data, &[2, 3, 4], &d).unwrap();
    let p = t.permute(&[2, 0, 1]).unwrap();
    assert!(std::ptr::eq(p.buffer(), t.buffer()), "permute is a view");
    assert_eq!(p.shape(), &[4, 2, 3]);
    let want: Vec<f32> = strided_indices(&[4, 2, 3], &[1, 12, 4], 0)
        .iter()
        .map(|&i| data[i])
        .collect();
    assert_eq!(p.to_vec::<f32>().unwrap(), want);
    let n = t.narrow(2, 1, 2).unwrap();
    assert!(std::ptr::eq(n.buffer(), t.buffer()));
    let want: Vec<f32> = strided_indices(&[2, 3, 2], &[12, 4, 1], 1)
        .iter()
        .map(|&i| data[i])
        .collect();
    assert_eq!(n.to_vec::<f32>().unwrap(), want);
    assert_eq!(
        n.flatten().unwrap().to_vec::<f32>().unwrap(),
        want,
        "flatten of a narrowed view copies correctly"
    );
    let u = t.unsqueeze(1).unwrap();
    assert_eq!(u.shape(), &[2, 1, 3, 4]);
    assert_eq!(u.squeeze(1).unwrap().shape(), &[2, 3, 4]);
    assert!(u.squeeze(0).is_err(), "only size-1 dims squeeze");
    let r = t.reshape(&[usize::MAX, 4]).unwrap();
    assert_eq!(r.shape(), &[6, 4]);
    let b = Tensor::from_slice(&[1.0f32, 2.0], &[2, 1], &d)
        .unwrap()
        .broadcast_to(&[3, 2, 4])
        .unwrap();
    assert!(
        !std::ptr::eq(b.buffer(), b.contiguous().unwrap().buffer()),
        "a broadcast view is not dense"
    );
    assert_eq!(b.sum_all().unwrap().item().unwrap(), 3.0 * 4.0 * 3.0);
    // A broadcast view past the kernels' 32-bit element indices is refused (a sum over 2^32 + 8 ones came out 8).
    let one = Tensor::ones(&[1, 1], DType::F32, &d).unwrap();
    for shape in [[1, 1 << 31], [1 << 16, 1 << 16], [2, usize::MAX]] {
        let message = one.broadcast_to(&shape).unwrap_err().to_string();
        assert!(message.contains("32-bit"), "{shape:?}: {message}");
    }
    assert_eq!(
        one.broadcast_to(&[1, i32::MAX as usize]).unwrap().numel(),
        i32::MAX as usize
    );
    // Sizes whose sums or products pass usize are errors, not overflows.
    assert!(t.narrow(1, usize::MAX, 2).is_err());
    assert!(t.reshape(&[1 << 40, 1 << 40]).is_err());
    assert!(t.reshape(&[usize::MAX, 1 << 40, 1 << 40]).is_err());
    let dest = Tensor::zeros(&[2, 3], DType::F32, &d).unwrap();
    assert!(
        dest.write_at(1, usize::MAX, &Tensor::zeros(&[2, 2], DType::F32, &d).unwrap())
            .is_err()
    );
    let e = t.narrow(1, 3, 0).unwrap();
    assert_eq!((e.shape(), e.numel()), (&[2usize, 0, 4][..], 0));
    assert!(e.to_vec::<f32>().unwrap().is_empty());
}

#[test]
fn assign_overwrites_in_place() {
    let d = dev();
    let p = Tensor::from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], &d).unwrap();
    let before = p.buffer() as *const _;
    p.assign(&Tensor::from_slice(&[5.0f32, 6.0], &[2], &d).unwrap())
        .unwrap();
    assert_eq!(p.buffer() as *const _, before);
    assert_eq!(
        p.to_vec::<f32>().unwrap(),
        vec![5.0, 6.0, 5.0, 6.0],
        "broadcast on assign"
    );
    assert!(
        p.assign(&p).is_err(),
        "a tensor cannot be assigned from its own storage"
    );
    assert!(
        p.t().unwrap().assign(&p.mul_scalar(2.0).unwrap()).is_err(),
        "destination must be dense"
    );
    assert!(p.assign(&Tensor::zeros(&[3], DType::F32, &d).unwrap()).is_err());
}

#[test]
fn assign_into_rows_of_a_larger_tensor() {
    let d = dev();
    for dtype in [DType::F32, DType::BF16] {
        let base = Tensor::arange(0.0, 12.0, 1.0, DType::F32, &d)
            .unwrap()
            .reshape(&[4, 3])
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let ones = Tensor::ones(&[3], dtype, &d).unwrap();
        // Rows 2..4 start on element 6: a whole word even for packed 16-bit storage.
        base.narrow(0, 2, 2).unwrap().assign(&ones).unwrap();
        let got = base.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(
            got,
            [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0],
            "{dtype}"
        );
        let inside_a_word = base.narrow(0, 1, 1).unwrap().assign(&ones);
        assert_eq!(
            inside_a_word.is_err(),
            dtype == DType::BF16,
            "{dtype} at element 3: packed storage"
        );
        // An odd count ending inside a word leaves the other half of that word (the next element) alone.
        let flat = Tensor::arange(1.0, 7.0, 1.0, DType::F32, &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let tens = Tensor::from_slice(&[10.0f32, 20.0, 30.0], &[3], &d)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        flat.narrow(0, 0, 3).unwrap().assign(&tens).unwrap();
        let got = flat.to_dtype(DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(got, [10.0, 20.0, 30.0, 4.0, 5.0, 6.0], "{dtype} odd view");
    }
}

#[test]
fn async_readback_matches_blocking_readback() {
    let d = dev();
    let t = Tensor::arange(0.0, 10.0, 1.0, DType::F32, &d)
        .unwrap()
        .mul_scalar(0.5)
        .unwrap();
    let a = pollster::block_on(t.to_vec_async::<f32>()).unwrap();
    assert_eq!(a, t.to_vec::<f32>().unwrap());
}

#[test]
fn read_later_returns_the_values_at_the_time_of_the_call() {
    let d = dev();
    let t = Tensor::arange(0.0, 5.0, 1.0, DType::F32, &d).unwrap();
    let early = t.read_later::<f32>().unwrap();
    // Work recorded after the read does not reach it, even an in-place write to the same tensor.
    t.assign(&Tensor::full(&[5], 9.0, DType::F32, &d).unwrap()).unwrap();
    let view = t.narrow(0, 1, 2).unwrap().read_later::<f32>().unwrap();
    let unread = t.read_later::<f32>().unwrap();
    drop(unread);
    assert_eq!(view.wait().unwrap(), vec![9.0, 9.0]);
    assert_eq!(early.wait().unwrap(), vec![0.0, 1.0, 2.0, 3.0, 4.0]);
    let empty = t.narrow(0, 2, 0).unwrap().read_later::<f32>().unwrap();
    assert!(empty.wait().unwrap().is_empty());
    assert!(t.read_later::<u32>().is_err());
}
