package main

import (
	"context"
	"io"
)

func webhookCmd(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	return 2
}
