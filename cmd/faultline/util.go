package main

import (
	"errors"
	"net/http"
)

func serveErr(err error) error {
	if err == nil || errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}
