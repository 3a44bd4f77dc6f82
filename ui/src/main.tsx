import { render } from 'preact';
import { App } from './app';
import { installShellHooks } from './shell';
import { applyTheme, rememberedTheme } from './theme';
import './style.css';

installShellHooks();
// The theme this browser last showed until the engine says which one Settings chose (App applies it then).
applyTheme(rememberedTheme());
render(<App />, document.getElementById('app')!);
