// Package watcher copies the store-client library's watcher factory registry (its package
// store-client/pkg/watcher), as the store-client declares it, so that the adapter of
// docs/migrating.md compiles and runs in tests. The library cannot import the store-client
// module.
package watcher

import (
	"context"
	"fmt"
	"sync"

	"github.com/pgchangestream/pgchangestream/internal/storeclient/datastore"
)

// WatcherConfig configures a change stream watcher.
type WatcherConfig struct {
	Pipeline       datastore.Pipeline
	CollectionName string
	ResumeToken    []byte
	ClientName     string
	Options        map[string]interface{}
}

// WatcherFactory creates change stream watchers for one datastore provider.
type WatcherFactory interface {
	CreateChangeStreamWatcher(ctx context.Context, ds datastore.DataStore, config WatcherConfig) (datastore.ChangeStreamWatcher, error)
	SupportedProvider() datastore.DataStoreProvider
}

var (
	mu        sync.RWMutex
	factories = map[datastore.DataStoreProvider]WatcherFactory{}
)

// RegisterWatcherFactory registers the factory of a provider, replacing any earlier one.
func RegisterWatcherFactory(provider datastore.DataStoreProvider, factory WatcherFactory) {
	mu.Lock()
	defer mu.Unlock()
	factories[provider] = factory
}

// CreateChangeStreamWatcher creates a watcher with the factory of ds's provider.
func CreateChangeStreamWatcher(ctx context.Context, ds datastore.DataStore, config WatcherConfig) (datastore.ChangeStreamWatcher, error) {
	if config.ClientName == "" {
		return nil, fmt.Errorf("ClientName is required in WatcherConfig")
	}
	mu.RLock()
	factory, ok := factories[ds.Provider()]
	mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("no watcher factory registered for provider: %s", ds.Provider())
	}
	return factory.CreateChangeStreamWatcher(ctx, ds, config)
}
