"""Train a tiny diffusion model on neuron, then sample from it.

    python examples/train_tiny_diffusion.py [--steps 200] [--batch 16] [--samples 4] [--sample-steps 50] [--compile]

A small diffusers UNet2DModel learns DDPM noise prediction on a synthetic dataset of 16x16 images
(one bright square on a dark background, at a random place and in one of three colours), then
DDPMScheduler draws a few images from pure noise. Everything runs on the device; no downloads.
"""
from __future__ import annotations

import argparse

import torch
from diffusers import DDPMScheduler, UNet2DModel

import torchneuron  # noqa: F401  (registers the device when autoload is off)

SIZE = 16
COLOURS = torch.tensor([[1.0, -1.0, -1.0], [-1.0, 1.0, -1.0], [-1.0, -1.0, 1.0]])


def squares(batch: int, generator: torch.Generator) -> torch.Tensor:
    """A batch of images in [-1, 1]: each a 6x6 square of one colour on a black background."""
    images = -torch.ones(batch, 3, SIZE, SIZE)
    corners = torch.randint(0, SIZE - 6, (batch, 2), generator=generator)
    colours = COLOURS[torch.randint(0, len(COLOURS), (batch,), generator=generator)]
    for image, (y, x), colour in zip(images, corners.tolist(), colours):
        image[:, y:y + 6, x:x + 6] = colour[:, None, None]
    return images


def tiny_unet() -> UNet2DModel:
    return UNet2DModel(sample_size=SIZE, in_channels=3, out_channels=3, block_out_channels=(16, 32),
                       layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=8, attention_head_dim=8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--sample-steps", type=int, default=50)
    parser.add_argument("--compile", action="store_true", help='torch.compile(backend="neuron") the UNet')
    args = parser.parse_args()

    device = torch.device("neuron")
    torch.manual_seed(0)
    data = torch.Generator().manual_seed(0)
    model = tiny_unet().to(device)
    run = torch.compile(model, backend="neuron") if args.compile else model
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)

    model.train()
    for step in range(args.steps):
        clean = squares(args.batch, data).to(device)
        noise = torch.randn(clean.shape, device=device)
        timesteps = torch.randint(0, scheduler.config.num_train_timesteps, (args.batch,), device=device)
        noisy = scheduler.add_noise(clean, noise, timesteps)
        loss = torch.nn.functional.mse_loss(run(noisy, timesteps).sample, noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step} loss {loss.item():.4f}", flush=True)

    model.eval()
    scheduler.set_timesteps(args.sample_steps, device=device)
    images = torch.randn(args.samples, 3, SIZE, SIZE, device=device)
    with torch.no_grad():
        for t in scheduler.timesteps:
            images = scheduler.step(run(images, t).sample, t, images).prev_sample
    images = images.clamp(-1, 1).cpu()
    # a trained model draws mostly background (-1) with one bright square, as the data has
    reference = squares(256, torch.Generator().manual_seed(1))
    print(f"sampled {args.samples} images {tuple(images.shape[1:])}: mean {images.mean():.3f}, "
          f"fraction above 0 {(images > 0).float().mean():.3f} (data: mean {reference.mean():.3f}, "
          f"fraction above 0 {(reference > 0).float().mean():.3f})")


if __name__ == "__main__":
    main()
