// Package gatewayit holds the agent's integration tests against a real
// gateway (gateway/gatewaytest) producing to a real Kafka broker
// (internal/testenv). It is a separate package so that the agent's unit
// tests do not depend on the gateway's test helpers.
package gatewayit
