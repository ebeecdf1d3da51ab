// The safe wrapper against direct calls of the C ABI on the same data, error propagation, and bf16 training.
mod common;

use common::data;
use lbopt::ffi;
use lbopt::{AdamW, StateKind};

/// The same steps through raw FFI calls, as a C program would make them.
fn c_steps(kind: i32, p: &mut [f32], g: &[f32], lrs: &[f64]) {
    unsafe {
        let mut layout = ffi::lbopt_layout::default();
        assert_eq!(ffi::lbopt_state_layout(kind, p.len() as i64, &mut layout, std::mem::size_of::<ffi::lbopt_layout>()), 0);
        let mut words = vec![vec![0u32; (layout.codes_bytes as usize + 3) / 4]; 2];
        let mut scales = vec![vec![0f32; layout.scales_numel as usize]; 2];
        let (mut n, mut cn, mut sn) = (p.len() as i64, layout.codes_numel, layout.scales_numel);
        let dev = ffi::DLDevice { device_type: ffi::KDL_CPU, device_id: 0 };
        let f32t = ffi::DLDataType { code: ffi::KDL_FLOAT, bits: 32, lanes: 1 };
        let mk = |d: *mut std::os::raw::c_void, s: *mut i64, t| ffi::DLTensor {
            data: d, device: dev, ndim: 1, dtype: t, shape: s, strides: std::ptr::null_mut(), byte_offset: 0 };
        let tp = mk(p.as_mut_ptr().cast(), &mut n, f32t);
        let tg = mk(g.as_ptr() as *mut _, &mut n, f32t);
        let (w0, w1) = words.split_at_mut(1);
        let (s0, s1) = scales.split_at_mut(1);
        let tmc = mk(w0[0].as_mut_ptr().cast(), &mut cn, layout.codes_dtype);
        let tvc = mk(w1[0].as_mut_ptr().cast(), &mut cn, layout.codes_dtype);
        let tms = mk(s0[0].as_mut_ptr().cast(), &mut sn, f32t);
        let tvs = mk(s1[0].as_mut_ptr().cast(), &mut sn, f32t);
        let plain = kind == ffi::LBOPT_STATE_FP32;
        let mut cfg = ffi::lbopt_adamw_config::default();
        assert_eq!(ffi::lbopt_adamw_config_init(&mut cfg, std::mem::size_of::<ffi::lbopt_adamw_config>()), 0);
        cfg.state_kind = kind;
        for (i, &lr) in lrs.iter().enumerate() {
            let slot = ffi::lbopt_adamw_slot {
                struct_size: std::mem::size_of::<ffi::lbopt_adamw_slot>() as u32,
                param: &tp,
                grad: &tg,
                m: ffi::lbopt_state { codes: &tmc, scales: if plain { std::ptr::null() } else { &tms } },
                v: ffi::lbopt_state { codes: &tvc, scales: if plain { std::ptr::null() } else { &tvs } },
                vmax: ffi::lbopt_state { codes: std::ptr::null(), scales: std::ptr::null() },
                step: i as i64 + 1,
            };
            assert_eq!(ffi::lbopt_adamw_step(&cfg, lr, &slot, 1, std::ptr::null()), 0);
        }
    }
}

#[test]
fn wrapper_equals_direct_c_calls_for_every_kind() {
    assert!(lbopt::version().unwrap().starts_with("0."));
    let lrs: Vec<f64> = (1..=20).map(|s| 1e-2 * (1.0 + (s as f64).cos()) / 2.0).collect();
    for (kind, id) in [(StateKind::Bit4, 0), (StateKind::Bit8, 1), (StateKind::Fp8, 2), (StateKind::Fp32, 3)] {
        let g = data(5001, 2, 0.02);
        let mut a = data(5001, 1, 1.0);
        let mut b = a.clone();
        let mut opt = AdamW::new(kind, &[a.len()]).unwrap();
        for &lr in &lrs {
            opt.step(&mut [&mut a[..]], &[&g[..]], lr).unwrap();
        }
        c_steps(id, &mut b, &g, &lrs);
        assert_eq!(opt.steps(), 20);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()), "{kind:?} differs from the C calls");
        assert!(a.iter().zip(data(5001, 1, 1.0)).any(|(x, y)| x != &y), "{kind:?} did not move");
    }
}

#[test]
fn errors_carry_the_library_message() {
    let mut p = vec![0f32; 100];
    let g = vec![0f32; 99];
    let mut opt = AdamW::new(StateKind::Bit4, &[100]).unwrap();
    let err = opt.step(&mut [&mut p[..]], &[&g[..]], 1e-3).unwrap_err();
    assert_eq!(err.status, 6); // LBOPT_ERR_SHAPE
    assert!(err.message.contains("slots[0].grad"), "{}", err.message);
    let g100 = vec![0f32; 100];
    let err = opt.step(&mut [&mut p[..]], &[&g100[..]], -1.0).unwrap_err();
    assert!(err.message.contains("lr = -1"), "{}", err.message);
    assert_eq!(opt.steps(), 0);
    let bad = AdamW::new(StateKind::Bit8, &[10]).unwrap().hyper((1.0, 0.999), 1e-8, 0.0);
    let mut bad = bad;
    let err = bad.step(&mut [&mut vec![0f32; 10][..]], &[&vec![0f32; 10][..]], 1e-3).unwrap_err();
    assert!(err.message.contains("config.beta1"), "{}", err.message);
}

#[test]
fn bf16_params_train_with_a_cosine_schedule() {
    // minimize sum((w - t)^2) / 2 with bf16 weights (u16 bits) and f32 grads
    let t = data(4096, 3, 2.0);
    let to_bf16 = |x: f32| (x.to_bits() >> 16) as u16;
    let from_bf16 = |b: u16| f32::from_bits((b as u32) << 16);
    let mut w: Vec<u16> = vec![to_bf16(0.0); 4096];
    let mut opt = AdamW::new(StateKind::Bit4, &[4096]).unwrap().hyper((0.9, 0.999), 1e-8, 0.0);
    let loss = |w: &[u16]| w.iter().zip(&t).map(|(&b, &x)| (from_bf16(b) - x).powi(2) as f64).sum::<f64>() / 2.0;
    let first = loss(&w);
    for s in 1..=300 {
        let g: Vec<f32> = w.iter().zip(&t).map(|(&b, &x)| from_bf16(b) - x).collect();
        let lr = 0.05 * 0.5 * (1.0 + (std::f64::consts::PI * s as f64 / 300.0).cos());
        opt.step(&mut [&mut w[..]], &[&g[..]], lr).unwrap();
    }
    assert!(loss(&w) < 0.01 * first, "{} -> {}", first, loss(&w));
}
