package dcgm

import (
	"bufio"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// ParseDiscovery reads `dcgmi discovery -l` and returns DCGM's GPU ids by
// UUID: the ids `dcgmi diag` reports results under.
func ParseDiscovery(r io.Reader) (map[string]int, error) {
	out := map[string]int{}
	sc := bufio.NewScanner(r)
	cur := -1
	lineNo := 0
	for sc.Scan() {
		lineNo++
		line := strings.TrimSpace(sc.Text())
		if !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), "|")
		if len(cells) < 2 {
			continue
		}
		id := strings.TrimSpace(cells[0])
		info := strings.TrimSpace(cells[1])
		if id != "" {
			n, err := strconv.Atoi(id)
			if err != nil {
				if id == "GPU ID" || id == "Switch ID" || strings.HasSuffix(id, "ID") {
					cur = -1
					continue
				}
				return nil, fmt.Errorf("dcgm discovery: line %d: GPU id %q is not a number", lineNo, id)
			}
			cur = n
		}
		if u, ok := strings.CutPrefix(info, "Device UUID:"); ok && cur >= 0 {
			out[strings.TrimSpace(u)] = cur
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("dcgm discovery: %w", err)
	}
	return out, nil
}
